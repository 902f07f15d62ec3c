/* kf.runtime._launcher: the host side of a CUDA call, in C, where CPython's own
 * overhead is most of a small kernel's host time.
 *
 * One extension module built from runtime/_launcher_*.c (setup.py lists them):
 *
 *   _launcher_driver.c    cuLaunchKernel from plain Python ints; libcuda opened with dlopen
 *   _launcher_dispatch.c  the dispatch key of a call's arguments, configure(), key(), dispatch()
 *   _launcher_lane.c      Lane: a program's kernels launched with the outputs from torch's allocator
 *   _launcher_guarded.c   Guarded: a dispatch entry behind compiler/guards.py's checks
 *   _launcher_module.c    the module itself: its functions, constants and types
 *
 * What they share is declared here. Everything but PyInit__launcher has hidden
 * visibility: the names below are the extension's own, not its ABI.
 */
#ifndef KF_RUNTIME_LAUNCHER_H
#define KF_RUNTIME_LAUNCHER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* The signature of cuLaunchKernel in cuda.h (CUresult is an enum, an int in the ABI). */
typedef int (*cu_launch_kernel_t)(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shared_bytes, void *stream, void **params,
                                  void **extra);

/* cuLaunchKernel, set once under the GIL by load_driver_impl() (_launcher_driver.c); never
 * unloaded (libcuda stays for the process, as torch keeps it). */
extern cu_launch_kernel_t cu_launch_kernel;

/* Opens libcuda.so.1 and finds cuLaunchKernel: 0, or -1 with OSError set. */
int load_driver_impl(void);

/* Kernels with up to this many parameters build their parameter array on the stack;
 * more take one heap allocation per launch. */
#define KF_STACK_PARAMS 64

/* dispatch() checks (a bit set of its third argument) */
#define CHECK_OP 1
#define CHECK_AUTOCAST 2

/* Interned attribute and method names, made by kf_dispatch_init(). */
extern PyObject *str_shape, *str_dtype, *str_device, *str_is_contiguous, *str_requires_grad, *str_data_ptr,
    *str_get_device;
extern PyObject *miss;            /* _launcher.MISS */
extern PyTypeObject *tensor_type; /* torch.Tensor, from configure() */

/* fn() as a truth value: 1, 0, or -1 with an exception. */
int call_truth(PyObject *fn);
/* obj.name(): a new reference, or NULL with an exception. */
PyObject *call_method0(PyObject *obj, PyObject *name);

extern PyTypeObject LaneType, GuardedType;
/* A Lane's or a Guarded's call on the list of a call's tensors. */
PyObject *lane_run(PyObject *lane, PyObject *tensors);
PyObject *guarded_run(PyObject *guarded, PyObject *tensors);

/* Each file's module functions, added to the module by _launcher_module.c. */
extern PyMethodDef kf_launch_methods[], kf_dispatch_methods[];
/* The interned names, MISS and the dispatch constants: 0, or -1 with an exception. */
int kf_dispatch_init(PyObject *module);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif /* KF_RUNTIME_LAUNCHER_H */
