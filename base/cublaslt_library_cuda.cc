#include "base/cublaslt_library.h"

#include <dlfcn.h>

#include <string>

#include "base/error.h"

namespace zest::cuda {
namespace {

// Note: the soname first (the loader's own search: LD_LIBRARY_PATH, libzest's RUNPATH, the
// cache), then the toolkit's folder that CMake found, where a build tree's libzest finds it too.
void* open_library() {
  void* handle = dlopen(ZEST_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) handle = dlopen(ZEST_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw Error(ErrorKind::kDevice,
                std::string("cannot open cuBLASLt (" ZEST_CUBLASLT_SONAME ", or " ZEST_CUBLASLT_PATH
                            "): ") +
                    (reason != nullptr ? reason : "unknown reason") +
                    "; install the CUDA toolkit's cuBLAS or put its folder on LD_LIBRARY_PATH");
  }
  return handle;
}

template <typename Function>
void resolve(void* library, Function& function, const char* name) {
  function = reinterpret_cast<Function>(dlsym(library, name));
  if (function == nullptr) {
    throw Error(ErrorKind::kDevice, std::string("cuBLASLt (" ZEST_CUBLASLT_SONAME ") has no ") +
                                        name + "; zest was built against another CUDA version");
  }
}

CublasLt load() {
  void* library = open_library();
  CublasLt table{};
  resolve(library, table.create, "cublasLtCreate");
  resolve(library, table.destroy, "cublasLtDestroy");
  resolve(library, table.status_name, "cublasLtGetStatusName");
  resolve(library, table.status_string, "cublasLtGetStatusString");
  resolve(library, table.desc_create, "cublasLtMatmulDescCreate");
  resolve(library, table.desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(library, table.desc_set, "cublasLtMatmulDescSetAttribute");
  resolve(library, table.layout_create, "cublasLtMatrixLayoutCreate");
  resolve(library, table.layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(library, table.layout_set, "cublasLtMatrixLayoutSetAttribute");
  resolve(library, table.preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(library, table.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(library, table.preference_set, "cublasLtMatmulPreferenceSetAttribute");
  resolve(library, table.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(library, table.matmul, "cublasLtMatmul");
  return table;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt table = load();  // a throw leaves it unset: the next call tries again
  return table;
}

}  // namespace zest::cuda
