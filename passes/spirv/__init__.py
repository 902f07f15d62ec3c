"""The parts of kf-to-spirv (passes/to_spirv.py): its rewrites before and after
upstream's conversion, and the loop bound it records."""
