"""The parts of kf-lower-to-linalg (passes/lower_to_linalg.py): the linalg builders, the
lowering of each op, index checks, and f32 compute for torch-mlir's functions."""
