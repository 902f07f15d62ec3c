/* kf.runtime._launcher.Guarded: compiler/guards.py's checks that what a program was
 * built for still holds: the values a function reads besides its arguments (globals,
 * closure cells, attributes, dict and list contents) and the tensors it reaches, which
 * are read here at every call and appended to the call's tensors. A tiny register
 * machine: registers 0..n_consts-1 hold the constants (a globals dict, a cell, a module's __dict__), and each operation gets a
 * value from a register (itself, an item, an attribute, a cell's contents, an element),
 * writes it to the next register and checks it. The same operations as guards.run_guards,
 * whose reading this is. */
#include "_launcher.h"

#include <stddef.h>
#include <string.h>

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
PyObject *guarded_run(PyObject *obj, PyObject *tensors) {
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

PyTypeObject GuardedType = {
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
