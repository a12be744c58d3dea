"""Checks shared by every pipeline of the package."""


def check_callback_tensor_inputs(pipeline, names) -> None:
    """Raise a `ValueError` unless `names` (`callback_on_step_end_tensor_inputs`, or None) is a subset of the
    pipeline's `_callback_tensor_inputs`."""
    if names is not None and not set(names) <= set(pipeline._callback_tensor_inputs):
        raise ValueError(
            f"`callback_on_step_end_tensor_inputs` must be a subset of {pipeline._callback_tensor_inputs}, got "
            f"{names!r}."
        )
