//! The conformance cases. Each is a public `async fn(&TrialEnv) -> CaseResult`, so a plugin
//! author can also call one directly from an ordinary test.

pub mod backend;
pub mod connector;
pub mod faults;

use crate::suite::Case;

macro_rules! cases {
    ($($module:ident :: $name:ident),+ $(,)?) => {
        &[$(Case { name: stringify!($name), run: |env| Box::pin($module::$name(env)) }),+]
    };
}

/// Every case, in run order.
pub const ALL: &[Case] = cases![
    backend::backend_info_is_consistent,
    backend::backend_empty_batches,
    backend::backend_round_trip,
    backend::backend_multi_segment_gather_scatter,
    backend::backend_read_missing_is_not_found,
    backend::backend_size_mismatch_is_a_miss,
    backend::backend_exists_reports_written_only,
    backend::backend_exists_creates_nothing,
    backend::backend_remove,
    backend::backend_overwrite_replaces,
    backend::backend_per_item_results,
    backend::backend_unregistered_region_rejected,
    backend::backend_out_of_range_slice_rejected,
    backend::backend_deregistered_region_rejected,
    backend::backend_misaligned_slice_rejected,
    backend::backend_bad_item_does_not_fail_others,
    backend::backend_large_batch,
    backend::backend_concurrent_writers_same_key,
    backend::backend_concurrent_disjoint_batches,
    backend::backend_usage,
    backend::backend_device_memory_rejected,
    backend::backend_persists_across_instances,
    backend::backend_unusual_but_valid_names,
    backend::backend_path_escapes_are_unrepresentable,
    connector::connector_round_trip_mha_layer_first,
    connector::connector_round_trip_mha_page_first,
    connector::connector_round_trip_mha_page_first_direct,
    connector::connector_round_trip_mha_page_head,
    connector::connector_round_trip_mla_layer_first,
    connector::connector_round_trip_mla_page_first,
    connector::connector_round_trip_mla_page_first_direct,
    connector::connector_round_trip_bounce,
    connector::connector_aligned_pool_is_zero_copy,
    connector::connector_anchor_pool,
    connector::connector_exists_empty_is_zero,
    connector::connector_exists_stops_at_a_hole,
    connector::connector_exists_missing_first_is_zero,
    connector::connector_exists_all,
    connector::connector_exists_prefix_monotonic,
    connector::connector_exists_single_matches_batch,
    connector::connector_exists_creates_nothing,
    connector::connector_misses_are_per_page,
    connector::connector_empty_set_and_get,
    connector::connector_ragged_host_indices_rejected,
    connector::connector_bounce_miss_leaves_host_untouched,
    connector::connector_mla_non_writer_skips,
    connector::connector_mla_pages_are_shared_across_tp,
    connector::connector_mha_pages_are_rank_specific,
    connector::connector_other_model_misses,
    connector::connector_pp_stages_are_isolated,
    connector::connector_other_layout_misses,
    connector::connector_other_dtype_or_page_size_misses,
    connector::connector_batches_above_128_pages,
    connector::connector_io_before_register_is_an_error,
    connector::connector_set_twice,
    connector::connector_remove_pages,
    connector::connector_three_threads_10k_ops,
    connector::connector_concurrent_setters_same_keys,
    connector::connector_bit_flip_is_a_miss,
    connector::connector_truncated_object_is_a_miss,
    connector::connector_misplaced_object_is_a_miss,
    connector::connector_foreign_object_is_a_miss,
    connector::connector_garbage_object_is_a_miss,
    connector::connector_sglang_naming_raw_pages,
    connector::connector_sglang_missing_v_ends_the_prefix,
    connector::connector_raw_format_round_trip,
    connector::connector_reregister_pool,
    connector::connector_small_staging_chunks,
    faults::faults_write_errors_are_per_page,
    faults::faults_torn_reads_never_return_wrong_bytes,
    faults::faults_short_writes_are_caught_on_read,
    faults::faults_batch_cut_is_reported_per_page,
    faults::faults_latency_and_errors_under_concurrency,
    faults::faults_exists_errors_end_the_prefix,
];
