/* kf.runtime._launcher.launch: cuLaunchKernel for device pointers, called from Python with as
 * little in between as CPython allows.
 *
 * Why it exists: cuda.bindings' cuLaunchKernel wrapper costs several microseconds of
 * Python-level argument conversion on every call (its CUfunction/CUstream objects, the
 * kernelParams marshalling), which is most of a small kf kernel's host time. This is the
 * launcher Triton builds for the same reason: one METH_FASTCALL function that takes plain
 * ints, writes the pointers into a parameter array on the C stack and calls the driver.
 *
 * It never links libcuda: the driver is opened with dlopen("libcuda.so.1") on the first
 * launch (or load_driver()), so the module builds and imports on machines without a GPU,
 * and a launch there raises OSError instead of failing to load. runtime/cuda.py checks
 * the returned CUresult and names the error (cuda.bindings' cuGetErrorString) only on
 * the failure path.
 *
 *   launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, ptr0, ptr1, ...) -> int
 *
 * function: the CUfunction's address (int(cuda.bindings CUfunction)); stream: the raw
 * CUstream (torch._C._cuda_getCurrentRawStream(device)), 0 for the legacy default
 * stream; each ptr: one 64-bit kernel parameter (a device address). Returns the
 * CUresult, 0 on success. The launch is asynchronous, as cuLaunchKernel is.
 */
#include "_launcher.h"

#include <dlfcn.h>
#include <limits.h>

cu_launch_kernel_t cu_launch_kernel = NULL;

#define FIXED_ARGS 9
static const char *const fixed_names[FIXED_ARGS] = {
    "function", "gx", "gy", "gz", "bx", "by", "bz", "shared_bytes", "stream"};

int load_driver_impl(void) {
    if (cu_launch_kernel != NULL)
        return 0;
    /* The name the NVIDIA driver installs (and torch and cuda.bindings open); no
     * RTLD_GLOBAL: nothing else needs kf's handle's symbols. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError,
                     "kf.runtime._launcher: cannot load the CUDA driver (libcuda.so.1): %s; "
                     "kf's CUDA launches need the NVIDIA driver",
                     why ? why : "dlopen failed");
        return -1;
    }
    void *sym = dlsym(lib, "cuLaunchKernel");
    if (sym == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError,
                     "kf.runtime._launcher: libcuda.so.1 has no cuLaunchKernel: %s",
                     why ? why : "dlsym failed");
        dlclose(lib);
        return -1;
    }
    cu_launch_kernel = (cu_launch_kernel_t)sym;
    return 0;
}

/* An unsigned 64-bit value from a Python int, or -1 with TypeError/OverflowError
 * naming the argument (position is 1-based, as the user counts). */
static int as_u64(PyObject *obj, Py_ssize_t position, const char *name, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "launch() argument %zd (%s) must be int, not %.100s",
                     position, name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError,
                     "launch() argument %zd (%s) must be an int in [0, 2**64), got %R",
                     position, name, obj);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

PyDoc_STRVAR(launch_doc,
"launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, *pointers) -> int\n\n"
"cuLaunchKernel(function, grid, block, shared_bytes, stream, pointers): every argument\n"
"an int; function is the CUfunction's address, stream the raw CUstream (0: the legacy\n"
"default stream), each pointer one 64-bit kernel parameter. Returns the CUresult\n"
"(0: queued). Raises TypeError/OverflowError for bad arguments and OSError where\n"
"libcuda.so.1 cannot be loaded.");

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < FIXED_ARGS) {
        PyErr_Format(PyExc_TypeError,
                     "launch() takes function, gx, gy, gz, bx, by, bz, shared_bytes, stream "
                     "and the kernel's pointers (at least %d arguments, %zd given)",
                     FIXED_ARGS, nargs);
        return NULL;
    }
    uint64_t fixed[FIXED_ARGS];
    for (Py_ssize_t i = 0; i < FIXED_ARGS; i++) {
        if (as_u64(args[i], i + 1, fixed_names[i], &fixed[i]) < 0)
            return NULL;
        /* grid, block and shared bytes are unsigned int in the driver's signature */
        if (i >= 1 && i <= 7 && fixed[i] > UINT_MAX) {
            PyErr_Format(PyExc_OverflowError, "launch() argument %zd (%s) must be below 2**32, got %R",
                         i + 1, fixed_names[i], args[i]);
            return NULL;
        }
    }
    if (fixed[0] == 0) {
        PyErr_SetString(PyExc_ValueError, "launch() argument 1 (function) is a null CUfunction");
        return NULL;
    }

    Py_ssize_t n = nargs - FIXED_ARGS;
    uint64_t stack_slots[KF_STACK_PARAMS];
    void *stack_params[KF_STACK_PARAMS];
    uint64_t *slots = stack_slots;
    void **params = stack_params;
    void *heap = NULL;
    if (n > KF_STACK_PARAMS) {
        heap = PyMem_Malloc((size_t)n * (sizeof(uint64_t) + sizeof(void *)));
        if (heap == NULL)
            return PyErr_NoMemory();
        params = (void **)heap;
        slots = (uint64_t *)(params + n);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_u64(args[FIXED_ARGS + i], FIXED_ARGS + i + 1, "pointer", &slots[i]) < 0) {
            PyMem_Free(heap);
            return NULL;
        }
        params[i] = &slots[i];
    }
    if (cu_launch_kernel == NULL && load_driver_impl() < 0) {
        PyMem_Free(heap);
        return NULL;
    }

    int err;
    /* The driver may block (a full launch queue); other Python threads run meanwhile,
     * as they do around cuda.bindings' launch. */
    Py_BEGIN_ALLOW_THREADS
    err = cu_launch_kernel((void *)(uintptr_t)fixed[0], (unsigned int)fixed[1], (unsigned int)fixed[2],
                           (unsigned int)fixed[3], (unsigned int)fixed[4], (unsigned int)fixed[5],
                           (unsigned int)fixed[6], (unsigned int)fixed[7], (void *)(uintptr_t)fixed[8],
                           params, NULL);
    Py_END_ALLOW_THREADS
    PyMem_Free(heap);
    return PyLong_FromLong(err);
}

PyDoc_STRVAR(load_driver_doc,
"load_driver() -> None\n\n"
"Open libcuda.so.1 and look up cuLaunchKernel now rather than on the first launch;\n"
"raises OSError, saying why, where the driver is missing.");

static PyObject *load_driver(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (load_driver_impl() < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyMethodDef kf_launch_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, launch_doc},
    {"load_driver", load_driver, METH_NOARGS, load_driver_doc},
    {NULL, NULL, 0, NULL},
};
