//! KVDIR (the vendor example in `examples/vendor-kvdir`) exported through the C ABI: the
//! same descriptor that a program can link in becomes a shared library hicache loads at
//! run time. Build it with `cargo build -p hicache-abi --example kvdir`: the library is
//! `target/<profile>/examples/libkvdir.so`.

hicache_abi::export_plugin!(kvdir::DESCRIPTOR);
