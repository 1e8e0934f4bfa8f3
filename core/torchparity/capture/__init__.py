"""Capture: seeing every op as the model runs (module hooks, TorchFunctionMode, TorchDispatchMode)."""
