/* kf.runtime._launcher's module: the functions of _launcher_driver.c and
 * _launcher_dispatch.c, the
 * the constants, and the Lane and Guarded types (_launcher.h says what each file holds). */
#include "_launcher.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "kf.runtime._launcher",
    "kf's compiled CUDA launcher: cuLaunchKernel from Python ints, and a call's common case from "
    "dispatch key to launch (see runtime/_launcher.h).",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* Only the entry point is visible outside the extension (_launcher.h hides the rest). */
PyMODINIT_FUNC PyInit__launcher(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, kf_launch_methods) < 0 || PyModule_AddFunctions(m, kf_dispatch_methods) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "STACK_PARAMS", KF_STACK_PARAMS) < 0)
        goto fail;
    if (kf_dispatch_init(m) < 0)
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
