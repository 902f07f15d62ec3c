/* kf.runtime._launcher.Lane: CudaProgram's fast lane and CompiledProgram.matched_call's
 * wrapper in one object: the profiling guard, the 16-byte alignment check, the outputs
 * from torch's allocator (the callable it was given), the launch on torch's current
 * stream and the result. Whatever is not that common case (profiling on, a misaligned
 * view, tensors on another device than the current one, a device the kernel is not bound
 * on yet) calls `slow`, the Python lane it stands for.
 */
#include "_launcher.h"

#include <limits.h>
#include <stddef.h>

/* One kernel of a lane: where its function is per device, its launch configuration and
 * which of the call's buffers each parameter is. */
typedef struct {
    PyObject *handles;    /* dict: torch device index -> CUfunction address (CudaKernel._handles) */
    PyObject *failed;     /* failed(err) raises CudaError for this kernel */
    unsigned int dims[7]; /* grid, block, shared bytes */
    Py_ssize_t n_params;
    Py_ssize_t order[KF_STACK_PARAMS]; /* parameter k is buffer order[k] (inputs, outputs, temporaries, constants) */
} LaneKernel;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t n_kernels;
    LaneKernel *kernels; /* PyMem_Malloc'd, n_kernels of them, launched in order */
    Py_ssize_t n_in, n_out, n_temps, n_consts;
    uint64_t temp_offsets[KF_STACK_PARAMS]; /* of each temporary in the one allocation */
    uint64_t const_ptrs[KF_STACK_PARAMS];   /* of each constant buffer, read when the lane is made */
    PyObject *constants; /* tuple of the constant buffers' tensors, kept alive by the lane */
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

PyObject *lane_run(PyObject *obj, PyObject *tensors) {
    LaneObject *self = (LaneObject *)obj;
    uint64_t bufs[KF_STACK_PARAMS], slots[KF_STACK_PARAMS], fns[KF_STACK_PARAMS];
    void *params[KF_STACK_PARAMS];
    PyObject *dev = NULL, *outs = NULL, *temp = NULL, *v;
    int r;

    if (!PyList_CheckExact(tensors) || PyList_GET_SIZE(tensors) != self->n_in)
        goto slow;
    /* kf.profile is recording (programs._PROFILE), or torch.profiler is */
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
    for (Py_ssize_t c = 0; c < self->n_consts; c++)
        bufs[self->n_in + self->n_out + self->n_temps + c] = self->const_ptrs[c];
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
                            "alignment", "temporaries", "constants", NULL};
    PyObject *kernels, *outputs, *alloc, *current_device, *raw_stream, *slow, *tree = Py_None, *unflatten = Py_None,
        *pglobals = Py_None, *pname = Py_None, *penabled = Py_None, *program = Py_None, *temps = Py_None,
        *consts = Py_None;
    Py_ssize_t n_in, first = -1, alignment = 16;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!nO!OOOO|nOOOOOOnOO:Lane", names, &PyTuple_Type, &kernels, &n_in,
                                     &PyTuple_Type, &outputs, &alloc, &current_device, &raw_stream, &slow, &first,
                                     &tree, &unflatten, &pglobals, &pname, &penabled, &program, &alignment, &temps,
                                     &consts))
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
    if (consts != Py_None && !PyTuple_Check(consts)) {
        PyErr_SetString(PyExc_TypeError, "Lane: constants is a tuple of tensors");
        return NULL;
    }
    Py_ssize_t n_consts = consts != Py_None ? PyTuple_GET_SIZE(consts) : 0;
    if (n_in < 1 || n_in + n_out + n_temps + n_consts > KF_STACK_PARAMS) {
        PyErr_Format(PyExc_ValueError, "Lane: 1 to %d buffers (inputs, outputs, temporaries and constants), got %zd "
                     "inputs, %zd outputs, %zd temporaries and %zd constants", KF_STACK_PARAMS, n_in, n_out, n_temps,
                     n_consts);
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
    self->n_consts = n_consts;
    self->first = first;
    self->alignment = (uint64_t)alignment;
    for (Py_ssize_t t = 0; t < n_temps; t++) {
        unsigned long long off = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(offsets, t));
        if (off == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        self->temp_offsets[t] = (uint64_t)off;
    }
    for (Py_ssize_t c = 0; c < n_consts; c++) {
        if (take_u64(call_method0(PyTuple_GET_ITEM(consts, c), str_data_ptr), &self->const_ptrs[c]) < 0)
            goto fail;
    }
    if (n_consts)
        self->constants = Py_NewRef(consts);
    if ((self->kernels = PyMem_Calloc((size_t)n_kernels, sizeof(LaneKernel))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n_kernels; k++) {
        if (lane_kernel(PyTuple_GET_ITEM(kernels, k), n_in + n_out + n_temps + n_consts, &self->kernels[k]) < 0)
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
    Py_VISIT(self->constants);
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
    Py_CLEAR(self->constants);
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
"     program=None, alignment=16, temporaries=None, constants=None)\n\n"
"A program's kernels, called with a list of tensors that a dispatch key matched to it\n"
"(shapes, dtypes, device, contiguity; the device is read at the first call and taken to\n"
"be the same at every later one, as the key holds it): outputs from alloc(shape, stride,\n"
"dtype), the temporaries at their offsets in one alloc(*temporaries[0]), each kernel\n"
"launched in order on raw_stream(device) with the buffers (inputs, outputs, temporaries,\n"
"then the tensors of constants: buffers on the call's device that every call passes, whose\n"
"addresses are read once) in its parameter order, and output `first`, or unflatten(tree, outputs), returned.\n"
"kernels: (handles, grid, block, shared_bytes, order, failed) each; handles: device index\n"
"-> CUfunction address (filled as the kernel is bound); failed(err) raises for a failed\n"
"launch. slow(tensors) answers every call that is not that case: profile_globals[\n"
"profile_name] not None or profiler_enabled() true, an input's address not a multiple of\n"
"alignment, tensors not on current_device(), a kernel with no handle on the device yet.");

PyTypeObject LaneType = {
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
