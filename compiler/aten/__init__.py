"""The ATen handlers of compiler/aten_to_kf.py, by op family; ``core`` holds the table and
the Converter."""
