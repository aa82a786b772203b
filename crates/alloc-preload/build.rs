// Give the library a soname. Without one, tools that replace malloc by soname (valgrind's
// memcheck treats objects without a soname like the main program) would replace loci's own
// malloc and test theirs instead.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libloci_malloc.so");
}
