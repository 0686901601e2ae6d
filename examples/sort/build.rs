//! Compiles Listing B.2 (`csrc/selection_sort.c`) with the system C compiler at -O2,
//! the flags `bench.sh` gives `mpicc` for the MPI peer: both versions sort with the
//! same machine code.

fn main() {
    println!("cargo:rerun-if-changed=csrc/selection_sort.c");
    println!("cargo:rerun-if-changed=csrc/selection_sort.h");
    cc::Build::new()
        .file("csrc/selection_sort.c")
        .opt_level(2)
        .debug(false)
        .compile("leda_selection_sort");
}
