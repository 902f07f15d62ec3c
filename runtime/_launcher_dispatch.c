/* kf.runtime._launcher's call path: the per-call work of a kf function between
 * KfFunction.__call__ and the launch, in C:
 *
 *   configure(tensor_type, dispatch_modes, grad_enabled, any_autocast) -> None
 *   key(args) -> (key, tensors) | (None, []) | MISS
 *   dispatch(table, args, checks) -> result | MISS
 *   Lane(...)(tensors) -> result      (_launcher_lane.c)
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
 */
#include "_launcher.h"

PyObject *str_shape, *str_dtype, *str_device, *str_is_contiguous, *str_requires_grad, *str_data_ptr, *str_get_device;
PyObject *miss = NULL;
PyTypeObject *tensor_type = NULL;
static PyObject *dispatch_modes = NULL, *grad_enabled = NULL, *any_autocast = NULL;

enum { KEY_NONE = 0, KEY_OK = 1, KEY_GRAD = 2, KEY_DEFER = 3 };

int call_truth(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

PyObject *call_method0(PyObject *obj, PyObject *name) {
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

PyMethodDef kf_dispatch_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"key", key, METH_O, key_doc},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL, dispatch_doc},
    {NULL, NULL, 0, NULL},
};

int kf_dispatch_init(PyObject *m) {
    if (PyModule_AddIntConstant(m, "CHECK_OP", CHECK_OP) < 0 ||
        PyModule_AddIntConstant(m, "CHECK_AUTOCAST", CHECK_AUTOCAST) < 0)
        return -1;
    if ((str_shape = PyUnicode_InternFromString("shape")) == NULL ||
        (str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
        (str_device = PyUnicode_InternFromString("device")) == NULL ||
        (str_is_contiguous = PyUnicode_InternFromString("is_contiguous")) == NULL ||
        (str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL ||
        (str_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL ||
        (str_get_device = PyUnicode_InternFromString("get_device")) == NULL)
        return -1;
    /* MISS: an instance of object, the one value dispatch() and key() answer "ask Python" with */
    if (miss == NULL && (miss = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL)
        return -1;
    return PyModule_AddObjectRef(m, "MISS", miss);
}
