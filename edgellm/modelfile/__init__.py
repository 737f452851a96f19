"""The packed model file: its format and reader, the quantization types (the numpy
reference of every kernel), the model config and the loader's checks."""
