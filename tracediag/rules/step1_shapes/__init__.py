"""Walk step 1, shapes and correctness: does the model config agree with the traced shapes and the TP degree."""
