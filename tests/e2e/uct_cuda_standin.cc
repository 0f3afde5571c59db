// A stand-in for UCX's CUDA transport library: its file name
// (libuct_cuda.so) is all that VMMIPC_INTERIOR_HANDLES=auto looks for, so the
// e2e tests dlopen this instead of a UCX build.
extern "C" int vmmipc_uct_cuda_standin() { return 0; }
