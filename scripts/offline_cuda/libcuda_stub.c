/* A stand-in libcuda.so.1 for compiling Mosaic GPU kernels on a machine without a GPU
 * (benchmarks/mosaic_sass.py): Mosaic GPU's compile asks the driver for the compute capability before it
 * runs its MLIR -> PTX -> ptxas pipeline. This library answers for one H200 (sm_90) and makes the final
 * module load fail, after the PTX and the ptxas report are written. */
#include <string.h>

typedef int CUresult;
static int context;

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) { *device = 0; return 0; }
CUresult cuDeviceGetName(char *name, int len, int device) { strncpy(name, "NVIDIA H200 (stub)", len); return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
  switch (attribute) {
    case 75: *value = 9; break;    /* compute capability major */
    case 76: *value = 0; break;    /* compute capability minor */
    case 16: *value = 132; break;  /* multiprocessors */
    default: *value = 0;
  }
  return 0;
}
CUresult cuCtxGetCurrent(void **ctx) { *ctx = &context; return 0; }
CUresult cuCtxGetDevice(int *device) { *device = 0; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return 0; }
CUresult cuCtxPushCurrent(void *ctx) { return 0; }
CUresult cuCtxPopCurrent(void **ctx) { *ctx = &context; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int device) { *ctx = &context; return 0; }
CUresult cuGetErrorString(CUresult error, const char **text) { *text = "no GPU (libcuda stub)"; return 0; }
CUresult cuGetErrorName(CUresult error, const char **text) { *text = "STUB_NO_GPU"; return 0; }
CUresult cuModuleLoadData(void **module, const void *image) { return 999; }
CUresult cuModuleLoadDataEx(void **module, const void *image, unsigned n, void *options, void **values) {
  return 999;
}
