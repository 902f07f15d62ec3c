/* kf.runtime._launcher: cuLaunchKernel for device pointers, called from Python with as
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
 * The second half of the file (below "dispatch") moves the rest of a small call's host
 * work out of Python bytecode: the dispatch key of the call's arguments, the checks that
 * decide whether a call may skip torch's op (torch_ops.needs_op) and the prebuilt fast
 * lane of a program (allocate the outputs and the temporaries, launch its kernels, return). It reads tensors
 * only through the Python C API (attributes and methods, as the Python code does), so
 * it needs no torch headers and stays correct for any torch version.
 *
 *   launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, ptr0, ptr1, ...) -> int
 *
 * function: the CUfunction's address (int(cuda.bindings CUfunction)); stream: the raw
 * CUstream (torch._C._cuda_getCurrentRawStream(device)), 0 for the legacy default
 * stream; each ptr: one 64-bit kernel parameter (a device address). Returns the
 * CUresult, 0 on success. The launch is asynchronous, as cuLaunchKernel is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* The signature of cuLaunchKernel in cuda.h (CUresult is an enum, an int in the ABI). */
typedef int (*cu_launch_kernel_t)(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shared_bytes, void *stream, void **params,
                                  void **extra);

/* Set once, under the GIL, by load_driver(); never unloaded (libcuda stays for the
 * process, as torch keeps it). */
static cu_launch_kernel_t cu_launch_kernel = NULL;

/* Kernels with up to this many parameters build their parameter array on the stack;
 * more take one heap allocation per launch. */
#define KF_STACK_PARAMS 64

#define FIXED_ARGS 9
static const char *const fixed_names[FIXED_ARGS] = {
    "function", "gx", "gy", "gz", "bx", "by", "bz", "shared_bytes", "stream"};

static int load_driver_impl(void) {
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

/* ====================================================================== dispatch
 *
 * The per-call work of a kf function between KfFunction.__call__ and the launch, in C:
 *
 *   configure(tensor_type, dispatch_modes, grad_enabled, any_autocast) -> None
 *   key(args) -> (key, tensors) | (None, []) | MISS
 *   dispatch(table, args, checks) -> result | MISS
 *   Lane(...)(tensors) -> result
 *
 * key() builds exactly the tuple compiler/api.py's _fast_key builds from positional
 * arguments (per tensor (shape, dtype, device, is_contiguous()), per list or tuple of
 * tensors (type, per-tensor tuples), per constant (type, value), a float that is zero or
 * NaN as (type, its 8 bytes)), reading the same
 * attributes through the Python C API, so either may fill the dispatch table the other
 * reads. MISS: an argument it leaves to Python (a list or tuple subclass).
 *
 * dispatch() is KfFunction.__call__'s common case in one call: with checks & 1, no
 * torch dispatch mode active and, where grad mode is on, no tensor requiring grad
 * (torch_ops.needs_op); with checks & 2, no autocast region; then the key, the table's
 * entry and its call on the flat tensors. Anything else (a miss, a tensor that requires
 * grad, an argument it cannot key, an exception while reading an argument) returns MISS,
 * and the caller runs its Python path from the start, which decides as it always did
 * and raises what it always raised.
 *
 * A Lane is CudaProgram's fast lane and CompiledProgram.matched_call's wrapper in one
 * object: the profiling guard, the 16-byte alignment check, the outputs from torch's
 * allocator (the callable it was given), the launch on torch's current stream and the
 * result. Whatever is not that common case (profiling on, a misaligned view, tensors on
 * another device than the current one, a device the kernel is not bound on yet) calls
 * `slow`, the Python lane it stands for.
 */

static PyObject *str_shape, *str_dtype, *str_device, *str_is_contiguous, *str_requires_grad,
    *str_data_ptr, *str_get_device;
static PyObject *miss = NULL;            /* _launcher.MISS */
static PyTypeObject *tensor_type = NULL; /* torch.Tensor, from configure() */
static PyObject *dispatch_modes = NULL, *grad_enabled = NULL, *any_autocast = NULL;

#define CHECK_OP 1
#define CHECK_AUTOCAST 2

enum { KEY_NONE = 0, KEY_OK = 1, KEY_GRAD = 2, KEY_DEFER = 3 };

static int call_truth(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

static PyObject *call_method0(PyObject *obj, PyObject *name) {
    PyObject *a[1] = {obj};
    return PyObject_VectorcallMethod(name, a, 1, NULL);
}

/* (shape, dtype, device, is_contiguous()) of a tensor: a new tuple, NULL on error. */
static PyObject *tensor_key(PyObject *t) {
    PyObject *k = PyTuple_New(4), *v;
    if (k == NULL)
        return NULL;
    if ((v = PyObject_GetAttr(t, str_shape)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(k, 0, v);
    if ((v = PyObject_GetAttr(t, str_dtype)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(k, 1, v);
    if ((v = PyObject_GetAttr(t, str_device)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(k, 2, v);
    if ((v = call_method0(t, str_is_contiguous)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(k, 3, v);
    return k;
fail:
    Py_DECREF(k);
    return NULL;
}

/* With *grad set: 1 where autograd would record a call of this tensor (it requires grad
 * and grad mode is on), else 0; -1 on error. Grad mode is asked only at the first tensor
 * that requires grad (most calls have none, and then it does not matter); where it is
 * off, *grad is cleared and no later tensor is asked either. */
static int records_grad(PyObject *t, int *grad) {
    if (!*grad)
        return 0;
    PyObject *v = PyObject_GetAttr(t, str_requires_grad);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (r <= 0)
        return r;
    if ((r = call_truth(grad_enabled)) == 0)
        *grad = 0;
    return r;
}

static PyObject *pair(PyObject *a, PyObject *b) { return PyTuple_Pack(2, a, b); }

/* The key of positional arguments (a tuple) and their tensors, flat (a list): KEY_OK with
 * *key_out and *tensors_out set (new references); KEY_NONE where _fast_key answers
 * (None, []); KEY_GRAD where grad is set, a tensor requires grad and grad mode is on
 * (torch_ops.needs_op would send the call through the op); KEY_DEFER for an argument
 * left to Python; -1 with an exception set. */
static int build_key(PyObject *args, int grad, PyObject **key_out, PyObject **tensors_out) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *key = PyTuple_New(n), *tensors = PyList_New(0), *seq = NULL;
    int rc = -1;
    if (key == NULL || tensors == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i), *item;
        if (PyObject_TypeCheck(a, tensor_type)) {
            int r = records_grad(a, &grad);
            if (r != 0) {
                rc = r < 0 ? -1 : KEY_GRAD;
                goto done;
            }
            if ((item = tensor_key(a)) == NULL || PyList_Append(tensors, a) < 0) {
                Py_XDECREF(item);
                goto done;
            }
        } else if (PyList_Check(a) || PyTuple_Check(a)) {
            if (!PyList_CheckExact(a) && !PyTuple_CheckExact(a)) {
                rc = KEY_DEFER; /* a subclass may index and iterate its own way */
                goto done;
            }
            /* a snapshot: reading a tensor's attributes runs Python that could change a list */
            seq = PyList_CheckExact(a) ? PyList_AsTuple(a) : Py_NewRef(a);
            if (seq == NULL)
                goto done;
            Py_ssize_t m = PyTuple_GET_SIZE(seq);
            if (m == 0 || !PyObject_TypeCheck(PyTuple_GET_ITEM(seq, 0), tensor_type)) {
                rc = KEY_NONE; /* not a list of tensors, and not a constant either */
                goto done;
            }
            for (Py_ssize_t j = 0; j < m; j++) {
                if (!PyObject_TypeCheck(PyTuple_GET_ITEM(seq, j), tensor_type)) {
                    rc = KEY_NONE;
                    goto done;
                }
            }
            PyObject *inner = PyTuple_New(m);
            if (inner == NULL)
                goto done;
            for (Py_ssize_t j = 0; j < m; j++) {
                PyObject *t = PyTuple_GET_ITEM(seq, j), *tk;
                int r = records_grad(t, &grad);
                if (r != 0) {
                    Py_DECREF(inner);
                    rc = r < 0 ? -1 : KEY_GRAD;
                    goto done;
                }
                if ((tk = tensor_key(t)) == NULL || PyList_Append(tensors, t) < 0) {
                    Py_XDECREF(tk);
                    Py_DECREF(inner);
                    goto done;
                }
                PyTuple_SET_ITEM(inner, j, tk);
            }
            item = pair((PyObject *)Py_TYPE(a), inner);
            Py_DECREF(inner);
            Py_CLEAR(seq);
            if (item == NULL)
                goto done;
        } else if (PyFloat_Check(a)) {
            /* a float by its bits where == is not bit equality: -0.0 == 0.0, and a NaN
             * equals no NaN (a new one each call would add an entry each call) */
            double d = PyFloat_AS_DOUBLE(a);
            if (d == 0.0 || d != d) {
                PyObject *bits = PyBytes_FromStringAndSize((const char *)&d, sizeof d);
                if (bits == NULL)
                    goto done;
                item = pair((PyObject *)Py_TYPE(a), bits);
                Py_DECREF(bits);
            } else {
                item = pair((PyObject *)Py_TYPE(a), a);
            }
            if (item == NULL)
                goto done;
        } else if (a == Py_None || PyLong_Check(a) || PyUnicode_Check(a)) {
            /* None, bool (an int), int, str: the type and the value are the key */
            if ((item = pair((PyObject *)Py_TYPE(a), a)) == NULL)
                goto done;
        } else {
            rc = KEY_NONE;
            goto done;
        }
        PyTuple_SET_ITEM(key, i, item);
    }
    *key_out = key;
    *tensors_out = tensors;
    return KEY_OK;
done:
    Py_XDECREF(seq);
    Py_XDECREF(key);
    Py_XDECREF(tensors);
    return rc;
}

static int need_configure(void) {
    if (tensor_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "kf.runtime._launcher: configure(torch.Tensor, ...) has not been called");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(configure_doc,
"configure(tensor_type, dispatch_modes, grad_enabled, any_autocast) -> None\n\n"
"What key() and dispatch() read: the tensor type (torch.Tensor) and three callables of\n"
"no arguments: the number of active torch dispatch modes, whether grad mode is on and\n"
"whether any autocast region is (compiler/api.py passes torch's own C functions).");

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "configure() takes 4 arguments, %zd given", nargs);
        return NULL;
    }
    if (!PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "configure() argument 1 must be a type (torch.Tensor)");
        return NULL;
    }
    for (int i = 1; i < 4; i++) {
        if (!PyCallable_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "configure() argument %d must be callable", i + 1);
            return NULL;
        }
    }
    Py_XSETREF(tensor_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(dispatch_modes, Py_NewRef(args[1]));
    Py_XSETREF(grad_enabled, Py_NewRef(args[2]));
    Py_XSETREF(any_autocast, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(key_doc,
"key(args) -> (key, tensors) | (None, []) | MISS\n\n"
"compiler/api.py's _fast_key(args) in C: the dispatch key of a tuple of positional\n"
"arguments and their tensors, flat; (None, []) where an argument is neither a tensor, a\n"
"list or tuple of tensors nor a constant (None, bool, int, float, str); MISS for an\n"
"argument it leaves to _fast_key (a list or tuple subclass).");

static PyObject *key(PyObject *self, PyObject *arg) {
    (void)self;
    if (need_configure() < 0)
        return NULL;
    if (!PyTuple_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "key() takes a tuple, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *k, *tensors;
    int rc = build_key(arg, 0, &k, &tensors);
    if (rc < 0)
        return NULL;
    if (rc == KEY_DEFER)
        return Py_NewRef(miss);
    if (rc == KEY_NONE)
        return Py_BuildValue("(O[])", Py_None);
    PyObject *r = pair(k, tensors);
    Py_DECREF(k);
    Py_DECREF(tensors);
    return r;
}

static PyTypeObject LaneType, GuardedType;
static PyObject *lane_run(PyObject *lane, PyObject *tensors);
static PyObject *guarded_run(PyObject *guarded, PyObject *tensors);

PyDoc_STRVAR(dispatch_doc,
"dispatch(table, args, checks) -> result | MISS\n\n"
"KfFunction's common call in one: with checks & 1, MISS while a torch dispatch mode is\n"
"active or, in grad mode, a tensor requires grad; with checks & 2, MISS in an autocast\n"
"region; then table[key(args)] called on the flat tensors (a Lane or a Guarded directly;\n"
"a Guarded whose guards fail answers MISS), or MISS\n"
"where the key is not in the table or cannot be made. Exceptions while reading the\n"
"arguments are left for the Python path to raise (MISS); the entry's own propagate.");

static PyObject *dispatch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "dispatch() takes (table: dict, args: tuple, checks: int)");
        return NULL;
    }
    if (need_configure() < 0)
        return NULL;
    long checks = PyLong_AsLong(args[2]);
    if ((checks & CHECK_OP) && call_truth(dispatch_modes) != 0)
        goto miss;
    if ((checks & CHECK_AUTOCAST) && call_truth(any_autocast) != 0)
        goto miss;
    PyObject *k, *tensors;
    if (build_key(args[1], (checks & CHECK_OP) != 0, &k, &tensors) != KEY_OK)
        goto miss;
    PyObject *entry = PyDict_GetItemWithError(args[0], k);
    Py_DECREF(k);
    if (entry == NULL) {
        Py_DECREF(tensors);
        goto miss;
    }
    Py_INCREF(entry); /* the table may change while the entry runs */
    PyObject *result = Py_IS_TYPE(entry, &GuardedType) ? guarded_run(entry, tensors)
                       : Py_IS_TYPE(entry, &LaneType) ? lane_run(entry, tensors)
                                                      : PyObject_CallOneArg(entry, tensors);
    Py_DECREF(entry);
    Py_DECREF(tensors);
    return result;
miss:
    PyErr_Clear(); /* the Python path reads the same arguments again and raises there */
    return Py_NewRef(miss);
}

/* ------------------------------------------------------------------------- Lane */

/* One kernel of a lane: where its function is per device, its launch configuration and
 * which of the call's buffers each parameter is. */
typedef struct {
    PyObject *handles;    /* dict: torch device index -> CUfunction address (CudaKernel._handles) */
    PyObject *failed;     /* failed(err) raises CudaError for this kernel */
    unsigned int dims[7]; /* grid, block, shared bytes */
    Py_ssize_t n_params;
    Py_ssize_t order[KF_STACK_PARAMS]; /* parameter k is buffer order[k] (inputs, outputs, temporaries) */
} LaneKernel;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n_kernels;
    LaneKernel *kernels; /* PyMem_Malloc'd, n_kernels of them, launched in order */
    Py_ssize_t n_in, n_out, n_temps;
    uint64_t temp_offsets[KF_STACK_PARAMS]; /* of each temporary in the one allocation */
    PyObject *temp_spec; /* (shape, stride, dtype) of that allocation, or NULL without temporaries */
    PyObject *outputs;   /* tuple of (shape, stride, dtype) */
    PyObject *alloc, *current_device, *raw_stream, *slow;
    PyObject *profile_globals, *profile_name, *profiler_enabled;
    Py_ssize_t first;    /* the result is output `first`; -1: unflatten(tree, outputs) */
    uint64_t alignment;  /* of every input's address: others go the slow way */
    PyObject *tree, *unflatten, *program;
    PyObject *device;    /* the tensors' device index (get_device()), read at the first call */
} LaneObject;

/* A uint64 from an int result, consuming the reference; -1 with an exception. */
static int take_u64(PyObject *v, uint64_t *out) {
    if (v == NULL)
        return -1;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "kf lane: expected an int, got %.100s", Py_TYPE(v)->tp_name);
        Py_DECREF(v);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)x;
    return 0;
}

static PyObject *lane_run(PyObject *obj, PyObject *tensors) {
    LaneObject *self = (LaneObject *)obj;
    uint64_t bufs[KF_STACK_PARAMS], slots[KF_STACK_PARAMS], fns[KF_STACK_PARAMS];
    void *params[KF_STACK_PARAMS];
    PyObject *dev = NULL, *outs = NULL, *temp = NULL, *v;
    int r;

    if (!PyList_CheckExact(tensors) || PyList_GET_SIZE(tensors) != self->n_in)
        goto slow;
    /* kf.profile is recording (driver._PROFILE), or torch.profiler is */
    if (self->profile_globals != NULL) {
        v = PyDict_GetItemWithError(self->profile_globals, self->profile_name);
        if (v == NULL && PyErr_Occurred())
            return NULL;
        if (v != NULL && v != Py_None)
            goto slow;
    }
    if (self->profiler_enabled != NULL) {
        if ((r = call_truth(self->profiler_enabled)) < 0)
            return NULL;
        if (r)
            goto slow;
    }
    for (Py_ssize_t i = 0; i < self->n_in; i++) {
        if (take_u64(call_method0(PyList_GET_ITEM(tensors, i), str_data_ptr), &bufs[i]) < 0)
            return NULL;
        if (bufs[i] % self->alignment) /* kf's kernels assume aligned buffers: a view at an offset */
            goto slow;
    }
    /* The device is the same at every call: a lane sits in the dispatch table under one
     * key, and the key holds every tensor's device. */
    if (self->device == NULL && (self->device = call_method0(PyList_GET_ITEM(tensors, 0), str_get_device)) == NULL)
        return NULL;
    dev = Py_NewRef(self->device);
    if ((v = PyObject_CallNoArgs(self->current_device)) == NULL)
        goto fail;
    r = PyObject_RichCompareBool(dev, v, Py_EQ);
    Py_DECREF(v);
    if (r < 0)
        goto fail;
    if (r == 0) /* not the current device: torch.empty on the tensors' device, in Python */
        goto slow;
    for (Py_ssize_t k = 0; k < self->n_kernels; k++) {
        v = PyDict_GetItemWithError(self->kernels[k].handles, dev);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto slow; /* not bound on this device yet: the Python lane binds it */
        }
        if (take_u64(Py_NewRef(v), &fns[k]) < 0)
            goto fail;
    }
    if ((outs = PyList_New(self->n_out)) == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < self->n_out; j++) {
        PyObject *spec = PyTuple_GET_ITEM(self->outputs, j);
        PyObject *out = PyObject_Vectorcall(self->alloc, ((PyTupleObject *)spec)->ob_item, 3, NULL);
        if (out == NULL)
            goto fail;
        PyList_SET_ITEM(outs, j, out);
        if (take_u64(call_method0(out, str_data_ptr), &bufs[self->n_in + j]) < 0)
            goto fail;
    }
    if (self->temp_spec != NULL) {
        /* every temporary in one allocation; freed when the launches are queued, which
         * the caching allocator makes safe: its next user is ordered after them on the
         * stream, as torch's own temporaries are */
        uint64_t base;
        temp = PyObject_Vectorcall(self->alloc, ((PyTupleObject *)self->temp_spec)->ob_item, 3, NULL);
        if (temp == NULL || take_u64(call_method0(temp, str_data_ptr), &base) < 0)
            goto fail;
        for (Py_ssize_t t = 0; t < self->n_temps; t++)
            bufs[self->n_in + self->n_out + t] = base + self->temp_offsets[t];
    }
    uint64_t stream;
    if (take_u64(PyObject_CallOneArg(self->raw_stream, dev), &stream) < 0)
        goto fail;
    if (cu_launch_kernel == NULL && load_driver_impl() < 0)
        goto fail;
    for (Py_ssize_t k = 0; k < self->n_kernels; k++) {
        LaneKernel *kn = &self->kernels[k];
        for (Py_ssize_t i = 0; i < kn->n_params; i++) {
            slots[i] = bufs[kn->order[i]];
            params[i] = &slots[i];
        }
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = cu_launch_kernel((void *)(uintptr_t)fns[k], kn->dims[0], kn->dims[1], kn->dims[2], kn->dims[3],
                               kn->dims[4], kn->dims[5], kn->dims[6], (void *)(uintptr_t)stream, params, NULL);
        Py_END_ALLOW_THREADS
        if (err) {
            PyObject *code = PyLong_FromLong(err);
            if (code != NULL) {
                v = PyObject_CallOneArg(kn->failed, code); /* raises CudaError */
                Py_DECREF(code);
                Py_XDECREF(v);
            }
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError, "kf lane: cuLaunchKernel failed with CUresult %d", err);
            goto fail;
        }
    }
    Py_XDECREF(temp);
    Py_DECREF(dev);
    if (self->first >= 0) {
        v = Py_NewRef(PyList_GET_ITEM(outs, self->first));
        Py_DECREF(outs);
        return v;
    }
    v = PyObject_CallFunctionObjArgs(self->unflatten, self->tree, outs, NULL);
    Py_DECREF(outs);
    return v;
slow:
    Py_XDECREF(dev);
    return PyObject_CallOneArg(self->slow, tensors);
fail:
    Py_XDECREF(dev);
    Py_XDECREF(outs);
    Py_XDECREF(temp);
    return NULL;
}

static PyObject *lane_vectorcall(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a kf lane takes one argument: the list of the call's tensors");
        return NULL;
    }
    return lane_run(obj, args[0]);
}

static int lane_u32(PyObject *seq, Py_ssize_t n, unsigned int *out, const char *what) {
    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_TypeError, "Lane: %s must be a tuple of %zd ints", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(seq, i));
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        if (v > UINT_MAX) {
            PyErr_Format(PyExc_OverflowError, "Lane: %s holds a value above 2**32", what);
            return -1;
        }
        out[i] = (unsigned int)v;
    }
    return 0;
}

/* One kernel from (handles, grid, block, shared_bytes, order, failed), its parameters
 * naming buffers below n_buffers. */
static int lane_kernel(PyObject *spec, Py_ssize_t n_buffers, LaneKernel *kn) {
    PyObject *handles, *grid, *block, *shared, *order, *failed;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "O!OOOOO:Lane kernel", &PyDict_Type, &handles, &grid, &block,
                                                  &shared, &order, &failed)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Lane: each kernel is (handles, grid, block, shared_bytes, order, failed)");
        return -1;
    }
    if (lane_u32(grid, 3, kn->dims, "grid") < 0 || lane_u32(block, 3, kn->dims + 3, "block") < 0)
        return -1;
    unsigned long sh = PyLong_AsUnsignedLong(shared);
    if ((sh == (unsigned long)-1 && PyErr_Occurred()) || sh > UINT_MAX) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_OverflowError, "Lane: shared_bytes above 2**32");
        return -1;
    }
    kn->dims[6] = (unsigned int)sh;
    if (!PyTuple_Check(order) || PyTuple_GET_SIZE(order) > KF_STACK_PARAMS) {
        PyErr_SetString(PyExc_TypeError, "Lane: order must be a tuple of buffer indices");
        return -1;
    }
    kn->n_params = PyTuple_GET_SIZE(order);
    for (Py_ssize_t k = 0; k < kn->n_params; k++) {
        Py_ssize_t b = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, k));
        if (b == -1 && PyErr_Occurred())
            return -1;
        if (b < 0 || b >= n_buffers) {
            PyErr_Format(PyExc_ValueError, "Lane: order names buffer %zd of %zd", b, n_buffers);
            return -1;
        }
        kn->order[k] = b;
    }
    if (!PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError, "Lane: a kernel's failed must be callable");
        return -1;
    }
    kn->handles = Py_NewRef(handles);
    kn->failed = Py_NewRef(failed);
    return 0;
}

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"kernels", "n_in", "outputs", "alloc", "current_device", "raw_stream", "slow", "first",
                            "tree", "unflatten", "profile_globals", "profile_name", "profiler_enabled", "program",
                            "alignment", "temporaries", NULL};
    PyObject *kernels, *outputs, *alloc, *current_device, *raw_stream, *slow, *tree = Py_None, *unflatten = Py_None,
        *pglobals = Py_None, *pname = Py_None, *penabled = Py_None, *program = Py_None, *temps = Py_None;
    Py_ssize_t n_in, first = -1, alignment = 16;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!nO!OOOO|nOOOOOOnO:Lane", names, &PyTuple_Type, &kernels, &n_in,
                                     &PyTuple_Type, &outputs, &alloc, &current_device, &raw_stream, &slow, &first,
                                     &tree, &unflatten, &pglobals, &pname, &penabled, &program, &alignment, &temps))
        return NULL;
    if (alignment < 1) {
        PyErr_SetString(PyExc_ValueError, "Lane: alignment must be positive");
        return NULL;
    }
    Py_ssize_t n_out = PyTuple_GET_SIZE(outputs), n_kernels = PyTuple_GET_SIZE(kernels);
    PyObject *temp_spec = NULL, *offsets = NULL;
    if (temps != Py_None) {
        if (!PyTuple_Check(temps) || PyTuple_GET_SIZE(temps) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(temps, 0)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(temps, 0)) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(temps, 1))) {
            PyErr_SetString(PyExc_TypeError, "Lane: temporaries is ((shape, stride, dtype), offsets)");
            return NULL;
        }
        temp_spec = PyTuple_GET_ITEM(temps, 0);
        offsets = PyTuple_GET_ITEM(temps, 1);
    }
    Py_ssize_t n_temps = offsets ? PyTuple_GET_SIZE(offsets) : 0;
    if (n_in < 1 || n_in + n_out + n_temps > KF_STACK_PARAMS) {
        PyErr_Format(PyExc_ValueError, "Lane: 1 to %d buffers (inputs, outputs and temporaries), got %zd inputs, "
                     "%zd outputs and %zd temporaries", KF_STACK_PARAMS, n_in, n_out, n_temps);
        return NULL;
    }
    if (n_kernels < 1 || n_kernels > KF_STACK_PARAMS) {
        PyErr_Format(PyExc_ValueError, "Lane: 1 to %d kernels, got %zd", KF_STACK_PARAMS, n_kernels);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < n_out; j++) {
        PyObject *spec = PyTuple_GET_ITEM(outputs, j);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
            PyErr_SetString(PyExc_TypeError, "Lane: each output is a tuple (shape, stride, dtype)");
            return NULL;
        }
    }
    PyObject *fns[] = {alloc, current_device, raw_stream, slow};
    for (int i = 0; i < 4; i++) {
        if (!PyCallable_Check(fns[i])) {
            PyErr_SetString(PyExc_TypeError, "Lane: alloc, current_device, raw_stream and slow must be callable");
            return NULL;
        }
    }
    if (first < 0 && !PyCallable_Check(unflatten)) {
        PyErr_SetString(PyExc_TypeError, "Lane: without first, unflatten must be callable");
        return NULL;
    }
    if (first >= n_out) {
        PyErr_SetString(PyExc_ValueError, "Lane: first is not an output");
        return NULL;
    }
    if (pglobals != Py_None && (!PyDict_Check(pglobals) || !PyUnicode_Check(pname))) {
        PyErr_SetString(PyExc_TypeError, "Lane: profile_globals is a dict and profile_name a str");
        return NULL;
    }
    LaneObject *self = (LaneObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = lane_vectorcall;
    self->n_in = n_in;
    self->n_out = n_out;
    self->n_temps = n_temps;
    self->first = first;
    self->alignment = (uint64_t)alignment;
    for (Py_ssize_t t = 0; t < n_temps; t++) {
        unsigned long long off = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(offsets, t));
        if (off == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        self->temp_offsets[t] = (uint64_t)off;
    }
    if ((self->kernels = PyMem_Calloc((size_t)n_kernels, sizeof(LaneKernel))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n_kernels; k++) {
        if (lane_kernel(PyTuple_GET_ITEM(kernels, k), n_in + n_out + n_temps, &self->kernels[k]) < 0)
            goto fail;
        self->n_kernels = k + 1; /* what lane_clear releases */
    }
    self->temp_spec = Py_XNewRef(temp_spec);
    self->outputs = Py_NewRef(outputs);
    self->alloc = Py_NewRef(alloc);
    self->current_device = Py_NewRef(current_device);
    self->raw_stream = Py_NewRef(raw_stream);
    self->slow = Py_NewRef(slow);
    self->tree = Py_NewRef(tree);
    self->unflatten = Py_NewRef(unflatten);
    self->program = Py_NewRef(program);
    if (pglobals != Py_None) {
        self->profile_globals = Py_NewRef(pglobals);
        self->profile_name = Py_NewRef(pname);
    }
    if (penabled != Py_None)
        self->profiler_enabled = Py_NewRef(penabled);
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int lane_traverse(LaneObject *self, visitproc visit, void *arg) {
    for (Py_ssize_t k = 0; k < self->n_kernels; k++) {
        Py_VISIT(self->kernels[k].handles);
        Py_VISIT(self->kernels[k].failed);
    }
    Py_VISIT(self->temp_spec);
    Py_VISIT(self->outputs);
    Py_VISIT(self->alloc);
    Py_VISIT(self->current_device);
    Py_VISIT(self->raw_stream);
    Py_VISIT(self->slow);
    Py_VISIT(self->profile_globals);
    Py_VISIT(self->profile_name);
    Py_VISIT(self->profiler_enabled);
    Py_VISIT(self->tree);
    Py_VISIT(self->unflatten);
    Py_VISIT(self->program);
    Py_VISIT(self->device);
    return 0;
}

static int lane_clear(LaneObject *self) {
    for (Py_ssize_t k = 0; k < self->n_kernels; k++) {
        Py_CLEAR(self->kernels[k].handles);
        Py_CLEAR(self->kernels[k].failed);
    }
    Py_CLEAR(self->temp_spec);
    Py_CLEAR(self->outputs);
    Py_CLEAR(self->alloc);
    Py_CLEAR(self->current_device);
    Py_CLEAR(self->raw_stream);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->profile_globals);
    Py_CLEAR(self->profile_name);
    Py_CLEAR(self->profiler_enabled);
    Py_CLEAR(self->tree);
    Py_CLEAR(self->unflatten);
    Py_CLEAR(self->program);
    Py_CLEAR(self->device);
    return 0;
}

static void lane_dealloc(LaneObject *self) {
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    PyMem_Free(self->kernels);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *lane_get(LaneObject *self, void *which) {
    PyObject *v = *(PyObject **)((char *)self + (Py_ssize_t)which);
    return Py_NewRef(v ? v : Py_None);
}

static PyObject *lane_get_dims(LaneObject *self, void *unused) {
    (void)unused;
    PyObject *out = PyTuple_New(self->n_kernels);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < self->n_kernels; k++) {
        unsigned int *d = self->kernels[k].dims;
        PyObject *one = Py_BuildValue("((III)(III)I)", d[0], d[1], d[2], d[3], d[4], d[5], d[6]);
        if (one == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, k, one);
    }
    return out;
}

static PyGetSetDef lane_getset[] = {
    {"program", (getter)lane_get, NULL, "what made the lane (CompiledProgram)", (void *)offsetof(LaneObject, program)},
    {"slow", (getter)lane_get, NULL, "the Python lane: every call that is not the common case",
     (void *)offsetof(LaneObject, slow)},
    {"outputs", (getter)lane_get, NULL, "(shape, stride, dtype) per output", (void *)offsetof(LaneObject, outputs)},
    {"launch_dims", (getter)lane_get_dims, NULL, "(grid, block, shared bytes) per kernel", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(lane_doc,
"Lane(kernels, n_in, outputs, alloc, current_device, raw_stream, slow, first=-1, tree=None,\n"
"     unflatten=None, profile_globals=None, profile_name=None, profiler_enabled=None,\n"
"     program=None, alignment=16, temporaries=None)\n\n"
"A program's kernels, called with a list of tensors that a dispatch key matched to it\n"
"(shapes, dtypes, device, contiguity; the device is read at the first call and taken to\n"
"be the same at every later one, as the key holds it): outputs from alloc(shape, stride,\n"
"dtype), the temporaries at their offsets in one alloc(*temporaries[0]), each kernel\n"
"launched in order on raw_stream(device) with the buffers (inputs, outputs, temporaries)\n"
"in its parameter order, and output `first`, or unflatten(tree, outputs), returned.\n"
"kernels: (handles, grid, block, shared_bytes, order, failed) each; handles: device index\n"
"-> CUfunction address (filled as the kernel is bound); failed(err) raises for a failed\n"
"launch. slow(tensors) answers every call that is not that case: profile_globals[\n"
"profile_name] not None or profiler_enabled() true, an input's address not a multiple of\n"
"alignment, tensors not on current_device(), a kernel with no handle on the device yet.");

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kf.runtime._launcher.Lane",
    .tp_basicsize = sizeof(LaneObject),
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_vectorcall_offset = offsetof(LaneObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = lane_doc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_getset = lane_getset,
    .tp_new = lane_new,
};

/* ------------------------------------------------------------------------- Guarded */

/* compiler/guards.py's checks that what a program was built for still holds: the values
 * a function reads besides its arguments (globals, closure cells, attributes, dict and
 * list contents) and the tensors it reaches, which are read here at every call and
 * appended to the call's tensors. A tiny register machine: registers 0..n_consts-1 hold
 * the constants (a globals dict, a cell, a module's __dict__), and each operation gets a
 * value from a register (itself, an item, an attribute, a cell's contents, an element),
 * writes it to the next register and checks it. The same operations as guards.run_guards,
 * whose reading this is. */

enum { G_SAME = 0, G_ITEM = 1, G_ATTR = 2, G_CELL = 3, G_INDEX = 4 };
enum { C_NONE = 0, C_IS = 1, C_EQ = 2, C_KEYS = 3, C_LEN = 4, C_TENSOR = 5, C_NOKEY = 6 };

typedef struct {
    int get, check;
    Py_ssize_t src, slot, n; /* n: an index (G_INDEX) or a length (C_LEN, C_KEYS) */
    PyObject *arg, *expected;
} GuardOp;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *consts; /* tuple */
    Py_ssize_t n_ops, n_extra;
    GuardOp *ops;     /* PyMem_Malloc'd */
    PyObject *call;   /* the entry behind the guards */
} GuardedObject;

/* v equals e, type-exactly, and a float (or complex) bit for bit: 1, 0, or 0 on an error
 * (cleared: a value that cannot be compared has changed). */
static int scalar_equal(PyObject *v, PyObject *e) {
    if (v == e)
        return 1;
    if (Py_TYPE(v) != Py_TYPE(e))
        return 0;
    if (PyFloat_CheckExact(v)) {
        double a = PyFloat_AS_DOUBLE(v), b = PyFloat_AS_DOUBLE(e);
        return memcmp(&a, &b, sizeof a) == 0;
    }
    if (PyComplex_CheckExact(v)) {
        Py_complex a = PyComplex_AsCComplex(v), b = PyComplex_AsCComplex(e);
        return memcmp(&a, &b, sizeof a) == 0;
    }
    int r = PyObject_RichCompareBool(v, e, Py_EQ);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* The keys of dict v are the tuple e's, in order. */
static int same_keys(PyObject *v, PyObject *e, Py_ssize_t n) {
    if (!PyDict_Check(v) || PyDict_GET_SIZE(v) != n)
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *val;
    while (PyDict_Next(v, &pos, &k, &val)) {
        if (i >= n)
            return 0;
        PyObject *want = PyTuple_GET_ITEM(e, i++);
        if (k != want) {
            int r = PyObject_RichCompareBool(k, want, Py_EQ);
            if (r <= 0) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    return i == n;
}

/* A tensor's (shape, dtype, device, is_contiguous()) equals the tuple e: compared one
 * attribute at a time (no key tuple is made). 1, or 0 (errors cleared). */
static int tensor_matches(PyObject *t, PyObject *e) {
    static PyObject **names[3] = {&str_shape, &str_dtype, &str_device};
    if (tensor_type == NULL || !PyObject_TypeCheck(t, tensor_type) || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4)
        return 0;
    for (int i = 0; i < 4; i++) {
        PyObject *v = i < 3 ? PyObject_GetAttr(t, *names[i]) : call_method0(t, str_is_contiguous);
        if (v == NULL) {
            PyErr_Clear();
            return 0;
        }
        PyObject *want = PyTuple_GET_ITEM(e, i);
        int r = v == want ? 1 : PyObject_RichCompareBool(v, want, Py_EQ);
        Py_DECREF(v);
        if (r <= 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Run the guards: 1 where every check holds (extra[slot] then holds a new reference to
 * each reached tensor, where extra is not NULL), 0 where one fails; -1 only for a failed
 * allocation. */
static int guarded_check(GuardedObject *self, PyObject **extra) {
    Py_ssize_t n_consts = PyTuple_GET_SIZE(self->consts), n = n_consts + self->n_ops;
    PyObject *stack[64], **regs = n <= 64 ? stack : PyMem_Malloc(sizeof(PyObject *) * n);
    Py_ssize_t filled = 0;
    int ok = 1;
    if (regs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->n_extra && extra != NULL; i++)
        extra[i] = NULL;
    for (Py_ssize_t i = 0; i < n_consts; i++)
        regs[i] = PyTuple_GET_ITEM(self->consts, i); /* borrowed: the tuple holds them */
    for (Py_ssize_t i = 0; i < self->n_ops && ok; i++) {
        GuardOp *op = &self->ops[i];
        PyObject *src = regs[op->src], *v = NULL;
        switch (op->get) {
        case G_SAME:
            v = Py_NewRef(src);
            break;
        case G_ITEM:
            if (PyDict_CheckExact(src)) {
                v = PyDict_GetItemWithError(src, op->arg);
                Py_XINCREF(v);
            } else {
                v = PyObject_GetItem(src, op->arg);
            }
            break;
        case G_ATTR:
            v = PyObject_GetAttr(src, op->arg);
            break;
        case G_CELL:
            if (PyCell_Check(src)) {
                v = PyCell_GET(src);
                Py_XINCREF(v);
            }
            break;
        case G_INDEX:
            if (PyList_CheckExact(src) && op->n < PyList_GET_SIZE(src))
                v = Py_NewRef(PyList_GET_ITEM(src, op->n));
            else if (PyTuple_CheckExact(src) && op->n < PyTuple_GET_SIZE(src))
                v = Py_NewRef(PyTuple_GET_ITEM(src, op->n));
            break;
        }
        if (v == NULL) { /* missing, or its getter raised: the value has changed */
            PyErr_Clear();
            ok = 0;
            break;
        }
        regs[n_consts + filled++] = v;
        switch (op->check) {
        case C_NONE:
            break;
        case C_IS:
            ok = v == op->expected;
            break;
        case C_EQ:
            ok = scalar_equal(v, op->expected);
            break;
        case C_KEYS:
            ok = same_keys(v, op->expected, op->n);
            break;
        case C_LEN:
            ok = PyList_Check(v) && PyList_GET_SIZE(v) == op->n;
            break;
        case C_TENSOR:
            ok = tensor_matches(v, op->expected);
            if (ok && extra != NULL) {
                Py_XSETREF(extra[op->slot], Py_NewRef(v));
            }
            break;
        case C_NOKEY: {
            int r = PySequence_Contains(v, op->expected);
            ok = r == 0;
            PyErr_Clear();
            break;
        }
        default:
            ok = 0;
        }
    }
    for (Py_ssize_t i = 0; i < filled; i++)
        Py_DECREF(regs[n_consts + i]);
    if (regs != stack)
        PyMem_Free(regs);
    for (Py_ssize_t i = 0; i < self->n_extra && extra != NULL; i++) {
        if (!ok || extra[i] == NULL) { /* every slot is filled where the guards were made right */
            ok = 0;
            Py_CLEAR(extra[i]);
        }
    }
    return ok;
}

/* The entry's call on tensors with the reached tensors appended, or MISS where a guard
 * fails. */
static PyObject *guarded_run(PyObject *obj, PyObject *tensors) {
    GuardedObject *self = (GuardedObject *)obj;
    PyObject *all, *result, *small[16], **extra = self->n_extra <= 16 ? small : NULL;
    if (extra == NULL && (extra = PyMem_Malloc(sizeof(PyObject *) * self->n_extra)) == NULL)
        return PyErr_NoMemory();
    int ok = guarded_check(self, extra);
    if (ok <= 0) {
        if (extra != small)
            PyMem_Free(extra);
        return ok < 0 ? NULL : Py_NewRef(miss);
    }
    if (self->n_extra == 0) {
        all = Py_NewRef(tensors);
    } else {
        Py_ssize_t n = PyList_Check(tensors) ? PyList_GET_SIZE(tensors) : -1;
        all = n < 0 ? NULL : PyList_New(n + self->n_extra);
        if (all == NULL) {
            if (n < 0)
                PyErr_SetString(PyExc_TypeError, "a Guarded entry takes a list of tensors");
            for (Py_ssize_t i = 0; i < self->n_extra; i++)
                Py_DECREF(extra[i]);
            if (extra != small)
                PyMem_Free(extra);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            PyList_SET_ITEM(all, i, Py_NewRef(PyList_GET_ITEM(tensors, i)));
        for (Py_ssize_t i = 0; i < self->n_extra; i++)
            PyList_SET_ITEM(all, n + i, extra[i]); /* the reference check took */
    }
    if (extra != small)
        PyMem_Free(extra);
    result = Py_IS_TYPE(self->call, &LaneType) ? lane_run(self->call, all) : PyObject_CallOneArg(self->call, all);
    Py_DECREF(all);
    return result;
}

static PyObject *guarded_vectorcall(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a Guarded entry takes one argument: the list of the call's tensors");
        return NULL;
    }
    return guarded_run(obj, args[0]);
}

static PyObject *guarded_check_method(PyObject *obj, PyObject *unused) {
    (void)unused;
    GuardedObject *self = (GuardedObject *)obj;
    PyObject **extra = PyMem_Malloc(sizeof(PyObject *) * (self->n_extra ? self->n_extra : 1)), *out;
    if (extra == NULL)
        return PyErr_NoMemory();
    int ok = guarded_check(self, extra);
    if (ok <= 0) {
        PyMem_Free(extra);
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    }
    if ((out = PyList_New(self->n_extra)) != NULL) {
        for (Py_ssize_t i = 0; i < self->n_extra; i++)
            PyList_SET_ITEM(out, i, extra[i]);
    } else {
        for (Py_ssize_t i = 0; i < self->n_extra; i++)
            Py_DECREF(extra[i]);
    }
    PyMem_Free(extra);
    return out;
}

static int guarded_clear(GuardedObject *self) {
    for (Py_ssize_t i = 0; self->ops != NULL && i < self->n_ops; i++) {
        Py_CLEAR(self->ops[i].arg);
        Py_CLEAR(self->ops[i].expected);
    }
    Py_CLEAR(self->consts);
    Py_CLEAR(self->call);
    return 0;
}

static int guarded_traverse(GuardedObject *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; self->ops != NULL && i < self->n_ops; i++) {
        Py_VISIT(self->ops[i].arg);
        Py_VISIT(self->ops[i].expected);
    }
    Py_VISIT(self->consts);
    Py_VISIT(self->call);
    return 0;
}

static void guarded_dealloc(GuardedObject *self) {
    PyObject_GC_UnTrack(self);
    guarded_clear(self);
    PyMem_Free(self->ops);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *guarded_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *consts, *ops, *call;
    Py_ssize_t n_extra;
    static char *kwlist[] = {"consts", "ops", "n_extra", "call", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!nO:Guarded", kwlist, &PyTuple_Type, &consts, &PyTuple_Type,
                                     &ops, &n_extra, &call))
        return NULL;
    Py_ssize_t n_consts = PyTuple_GET_SIZE(consts), n_ops = PyTuple_GET_SIZE(ops);
    if (n_extra < 0 || !PyCallable_Check(call)) {
        PyErr_SetString(PyExc_TypeError, "Guarded: n_extra must be >= 0 and call callable");
        return NULL;
    }
    GuardedObject *self = (GuardedObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = guarded_vectorcall;
    self->n_extra = n_extra;
    self->ops = PyMem_Calloc(n_ops ? n_ops : 1, sizeof(GuardOp));
    if (self->ops == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->consts = Py_NewRef(consts);
    self->call = Py_NewRef(call);
    for (Py_ssize_t i = 0; i < n_ops; i++) {
        PyObject *spec = PyTuple_GET_ITEM(ops, i);
        int get, check;
        Py_ssize_t src, slot;
        PyObject *arg, *expected;
        if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "inOiOn:Guarded operation", &get, &src, &arg, &check,
                                                      &expected, &slot))
            goto bad;
        GuardOp *op = &self->ops[i];
        op->get = get, op->check = check, op->src = src, op->slot = slot;
        op->arg = Py_NewRef(arg);
        op->expected = Py_NewRef(expected);
        self->n_ops = i + 1;
        if (get < G_SAME || get > G_INDEX || check < C_NONE || check > C_NOKEY || src < 0 ||
            src >= n_consts + i) {
            PyErr_Format(PyExc_ValueError, "Guarded: operation %zd is malformed", i);
            goto fail;
        }
        if (get == G_INDEX && ((op->n = PyLong_AsSsize_t(arg)) < 0)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "Guarded: operation %zd: a negative index", i);
            goto fail;
        }
        if (check == C_LEN && (op->n = PyLong_AsSsize_t(expected)) < 0 && PyErr_Occurred())
            goto fail;
        if (check == C_KEYS) {
            if (!PyTuple_Check(expected)) {
                PyErr_Format(PyExc_TypeError, "Guarded: operation %zd: the keys must be a tuple", i);
                goto fail;
            }
            op->n = PyTuple_GET_SIZE(expected);
        }
        if (check == C_TENSOR && (slot < 0 || slot >= n_extra)) {
            PyErr_Format(PyExc_ValueError, "Guarded: operation %zd: tensor slot %zd of %zd", i, slot, n_extra);
            goto fail;
        }
    }
    return (PyObject *)self;
bad:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "Guarded: each operation is (get, src, arg, check, expected, slot)");
fail:
    Py_DECREF(self);
    return NULL;
}

static PyObject *guarded_get_call(GuardedObject *self, void *unused) {
    (void)unused;
    return Py_NewRef(self->call);
}

static PyObject *guarded_get_consts(GuardedObject *self, void *unused) {
    (void)unused;
    return Py_NewRef(self->consts);
}

static PyMethodDef guarded_methods[] = {
    {"check", guarded_check_method, METH_NOARGS,
     "check() -> list | None: the reached tensors, or None where a guard fails"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef guarded_getset[] = {
    {"call", (getter)guarded_get_call, NULL, "the entry behind the guards", NULL},
    {"consts", (getter)guarded_get_consts, NULL, "the guards' constants", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(guarded_doc,
"Guarded(consts, ops, n_extra, call)\n\n"
"A dispatch table's entry behind guards (compiler/guards.py): called with the list of a\n"
"call's tensors, it runs the operations -- each (get, src, arg, check, expected, slot):\n"
"get a value from register src (itself, src[arg], getattr(src, arg), a cell's contents,\n"
"element arg), write it to the next register, check it (identity, type- and bit-exact\n"
"equality, a dict's keys, a list's length, a tensor's (shape, dtype, device,\n"
"is_contiguous()) -- which puts it at extra[slot] -- or a key's absence) -- and returns\n"
"call(tensors + extra), or MISS where a check fails.");

static PyTypeObject GuardedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kf.runtime._launcher.Guarded",
    .tp_basicsize = sizeof(GuardedObject),
    .tp_dealloc = (destructor)guarded_dealloc,
    .tp_vectorcall_offset = offsetof(GuardedObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = guarded_doc,
    .tp_traverse = (traverseproc)guarded_traverse,
    .tp_clear = (inquiry)guarded_clear,
    .tp_methods = guarded_methods,
    .tp_getset = guarded_getset,
    .tp_new = guarded_new,
};

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

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, launch_doc},
    {"load_driver", load_driver, METH_NOARGS, load_driver_doc},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"key", key, METH_O, key_doc},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL, dispatch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kf.runtime._launcher",
    "kf's compiled CUDA launcher: cuLaunchKernel from Python ints (see _launcher.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__launcher(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "STACK_PARAMS", KF_STACK_PARAMS) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "CHECK_OP", CHECK_OP) < 0 ||
        PyModule_AddIntConstant(m, "CHECK_AUTOCAST", CHECK_AUTOCAST) < 0)
        goto fail;
    if ((str_shape = PyUnicode_InternFromString("shape")) == NULL ||
        (str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
        (str_device = PyUnicode_InternFromString("device")) == NULL ||
        (str_is_contiguous = PyUnicode_InternFromString("is_contiguous")) == NULL ||
        (str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL ||
        (str_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL ||
        (str_get_device = PyUnicode_InternFromString("get_device")) == NULL)
        goto fail;
    /* MISS: an instance of object, the one value dispatch() and key() answer "ask Python" with */
    if (miss == NULL && (miss = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL)
        goto fail;
    if (PyModule_AddObjectRef(m, "MISS", miss) < 0)
        goto fail;
    if (PyType_Ready(&LaneType) < 0 || PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0)
        goto fail;
    if (PyType_Ready(&GuardedType) < 0 || PyModule_AddObjectRef(m, "Guarded", (PyObject *)&GuardedType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
