//! The conformance cases. Each is a public `async fn(&TrialEnv) -> CaseResult`, so a plugin
//! author can also call one directly from an ordinary test.

pub mod backend;
pub mod cancel;
pub mod connector;
pub mod faults;
pub mod hybrid;
pub mod model;

use crate::broken::Bug::{self, *};
use crate::trial::{Case, Proof};

macro_rules! cases {
    ($($module:ident :: $name:ident => $proof:expr),+ $(,)?) => {
        &[$(Case {
            name: stringify!($name),
            run: |env| Box::pin($module::$name(env)),
            proof: $proof,
        }),+]
    };
}

const fn catches(bugs: &'static [Bug]) -> Proof {
    Proof::Catches(bugs)
}

const fn core(why: &'static str) -> Proof {
    Proof::CoreOnly(why)
}

/// Every case, in run order, with the planted bugs it is shown to catch.
pub const ALL: &[Case] = cases![
    backend::backend_info_is_consistent => catches(&[InfoLies]),
    backend::backend_empty_batches => catches(&[ExtraResult]),
    backend::backend_round_trip => catches(&[ReadsDeliverNothing, DropsLastResult]),
    backend::backend_multi_segment_gather_scatter => catches(&[TornWrites, ReadsDeliverNothing]),
    backend::backend_read_checked_checks_every_hit => catches(&[UncheckedReads]),
    backend::backend_write_sealed_seals_every_object => catches(&[UnsealedWrites]),
    backend::backend_read_missing_is_not_found => catches(&[MissIsError]),
    backend::backend_size_mismatch_is_a_miss => catches(&[IgnoresSizeMismatch]),
    backend::backend_exists_reports_written_only => catches(&[ExistsAlwaysTrue, ResultsReversed]),
    backend::backend_exists_creates_nothing => catches(&[ExistsCreates, ExistsAlwaysTrue]),
    backend::backend_remove => catches(&[RemoveDoesNothing, RemoveTakesNeighbour]),
    backend::backend_overwrite_replaces => catches(&[FirstWriteWins]),
    backend::backend_per_item_results => catches(&[ResultsReversed, CrossTalk, MissIsError]),
    backend::backend_unregistered_region_rejected => catches(&[SwallowsBadSlices]),
    backend::backend_out_of_range_slice_rejected => catches(&[SwallowsBadSlices]),
    backend::backend_deregistered_region_rejected => catches(&[DeregisterIgnored, SwallowsBadSlices]),
    backend::backend_misaligned_slice_rejected => catches(&[SwallowsBadSlices, NonAtomicPublish]),
    backend::backend_bad_item_does_not_fail_others => catches(&[FailsWholeBatch, SwallowsBadSlices]),
    backend::backend_large_batch => catches(&[ReadsDeliverNothing, OneObjectForAllNames]),
    backend::backend_segment_limit => catches(&[IgnoresSegmentLimit, TornWrites]),
    backend::backend_concurrent_writers_same_key => catches(&[NonAtomicPublish]),
    backend::backend_concurrent_disjoint_batches => catches(&[StaleReadCache, FirstWriteWins]),
    backend::backend_usage => catches(&[UsageLies]),
    backend::backend_list_pages_through_every_object => catches(&[ListEndsAfterFirstPage, ListsRemovedObjects]),
    backend::backend_device_memory_rejected => catches(&[AcceptsDeviceMemory]),
    backend::backend_persists_across_instances => catches(&[ForgetsOnReopen]),
    backend::backend_unusual_but_valid_names => catches(&[OneObjectForAllNames, TruncatesLongNames]),
    backend::backend_path_escapes_are_unrepresentable => core("object and page keys are validated by hicache-core before a plugin sees them"),
    connector::connector_round_trip_mha_layer_first => catches(&[ReadsDeliverNothing, OneObjectForAllNames]),
    connector::connector_round_trip_mha_page_first => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_round_trip_mha_page_first_direct => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_round_trip_mha_page_head => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_round_trip_mla_layer_first => catches(&[ReadsDeliverNothing, OneObjectForAllNames]),
    connector::connector_round_trip_mla_page_first => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_round_trip_mla_page_first_direct => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_round_trip_bounce => catches(&[ReadsDeliverNothing, OneObjectForAllNames]),
    connector::connector_pool_in_variant_memory => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_aligned_pool_is_zero_copy => catches(&[InfoLies]),
    connector::connector_anchor_pool => catches(&[MissIsError, OneObjectForAllNames]),
    connector::connector_exists_empty_is_zero => core("an empty batch_exists is answered by the connector without calling the plugin"),
    connector::connector_exists_stops_at_a_hole => catches(&[ExistsAlwaysTrue]),
    connector::connector_exists_missing_first_is_zero => catches(&[ExistsAlwaysTrue, ResultsReversed]),
    connector::connector_exists_all => catches(&[DropsLastResult, ExtraResult]),
    connector::connector_exists_prefix_monotonic => catches(&[ExistsCreates, RemoveDoesNothing, ReadsDeliverNothing]),
    connector::connector_exists_single_matches_batch => catches(&[ExistsCreates]),
    connector::connector_exists_creates_nothing => catches(&[ExistsCreates, ExistsAlwaysTrue]),
    connector::connector_misses_are_per_page => catches(&[ResultsReversed, MissIsError]),
    connector::connector_empty_set_and_get => core("empty batch_set and batch_get are answered by the connector without calling the plugin"),
    connector::connector_ragged_host_indices_rejected => catches(&[ExistsAlwaysTrue]),
    connector::connector_bounce_miss_leaves_host_untouched => catches(&[ResultsReversed, ReadsDeliverNothing]),
    connector::connector_mla_non_writer_skips => catches(&[ExistsAlwaysTrue]),
    connector::connector_mla_pages_are_shared_across_tp => catches(&[ForgetsOnReopen, ReadsDeliverNothing]),
    connector::connector_mha_pages_are_rank_specific => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_other_model_misses => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_pp_stages_are_isolated => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_other_layout_misses => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_other_dtype_or_page_size_misses => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_other_shape_same_page_size_misses => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    connector::connector_batches_above_128_pages => catches(&[CrossTalk, ReadsDeliverNothing]),
    connector::connector_io_before_register_is_an_error => core("the connector refuses I/O before register_pool without calling the plugin"),
    connector::connector_set_twice => catches(&[FirstWriteWins]),
    connector::connector_remove_pages => catches(&[RemoveDoesNothing, RemoveTakesNeighbour]),
    connector::connector_three_threads_10k_ops => catches(&[NonAtomicPublish, CrossTalk]),
    connector::connector_concurrent_setters_same_keys => catches(&[TornWrites, ReadsDeliverNothing]),
    connector::connector_bit_flip_is_a_miss => catches(&[StaleReadCache, FirstWriteWins]),
    connector::connector_truncated_object_is_a_miss => catches(&[IgnoresSizeMismatch, StaleReadCache]),
    connector::connector_misplaced_object_is_a_miss => catches(&[FirstWriteWins, CrossTalk]),
    connector::connector_foreign_object_is_a_miss => catches(&[FirstWriteWins]),
    connector::connector_garbage_object_is_a_miss => catches(&[FirstWriteWins]),
    connector::connector_sglang_naming_raw_pages => catches(&[OneObjectForAllNames, CrossTalk]),
    connector::connector_sglang_missing_v_ends_the_prefix => catches(&[RemoveDoesNothing, ExistsAlwaysTrue]),
    connector::connector_raw_format_round_trip => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_reregister_pool => catches(&[ReadsDeliverNothing, TornWrites]),
    connector::connector_small_staging_chunks => catches(&[CrossTalk, TornWrites]),
    hybrid::hybrid_round_trip_every_sidecar_shape => catches(&[ReadsDeliverNothing, TornWrites]),
    hybrid::hybrid_aligned_sidecars_move_in_place => catches(&[InfoLies, ReadsDeliverNothing]),
    hybrid::hybrid_exists_finds_what_transfers_wrote => catches(&[RemoveDoesNothing, ExistsAlwaysTrue]),
    hybrid::hybrid_partial_sidecar_hits => catches(&[ExistsAlwaysTrue, MissIsError]),
    hybrid::hybrid_trailing_pages_restorable_prefix => catches(&[ExistsAlwaysTrue, ReadsDeliverNothing]),
    hybrid::hybrid_sidecar_geometry_mismatch_misses => catches(&[DropsNameSuffix, OneObjectForAllNames]),
    hybrid::hybrid_batches_above_128_pages => catches(&[CrossTalk, ReadsDeliverNothing]),
    hybrid::hybrid_bad_calls_are_refused_before_io => core("v2 calls are checked whole by the connector before the plugin sees them"),
    faults::faults_write_errors_are_per_page => catches(&[ResultsReversed, ForgetsOnReopen]),
    faults::faults_torn_reads_never_return_wrong_bytes => catches(&[TornWrites, ForgetsOnReopen]),
    faults::faults_short_writes_are_caught_on_read => catches(&[IgnoresSizeMismatch]),
    faults::faults_batch_cut_is_reported_per_page => catches(&[ReadsDeliverNothing]),
    faults::faults_latency_and_errors_under_concurrency => catches(&[CrossTalk, ReadsDeliverNothing]),
    faults::faults_exists_errors_end_the_prefix => catches(&[DropsLastResult, ExtraResult]),
    cancel::cancel_dropped_calls_envelope_zero_copy => catches(&[WritesAfterDrop, NonAtomicPublish]),
    cancel::cancel_dropped_calls_raw_zero_copy => catches(&[WritesAfterDrop, PublishesAfterDrop]),
    cancel::cancel_dropped_calls_envelope_bounce => catches(&[NonAtomicPublish]),
    cancel::cancel_dropped_calls_raw_bounce => catches(&[PublishesAfterDrop, NonAtomicPublish]),
    cancel::cancel_unregister_waits_for_in_flight => catches(&[DropsLastResult, ExtraResult]),
    cancel::cancel_deregister_in_flight_is_busy => catches(&[NonAtomicPublish, PublishesAfterDrop]),
    cancel::cancel_dropped_read_moves_no_byte_afterwards => catches(&[WritesAfterDrop]),
    model::model_sequences_match_a_reference_map => catches(&[FirstWriteWins, RemoveDoesNothing, StaleReadCache, ExistsCreates]),
];
