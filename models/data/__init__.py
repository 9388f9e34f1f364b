"""Training data: JSONL readers, chat templates + assistant masks, built-ins, regeneration."""

from eaglenest.models.data.builtin import BUILTIN_NAMES, builtin_path
from eaglenest.models.data.readers import (
    Chat,
    Completion,
    DataError,
    Example,
    load_examples,
    read_jsonl,
)
from eaglenest.models.data.template import Sample, encode_example, encode_examples

__all__ = [
    "BUILTIN_NAMES",
    "Chat",
    "Completion",
    "DataError",
    "Example",
    "Sample",
    "builtin_path",
    "encode_example",
    "encode_examples",
    "load_examples",
    "read_jsonl",
]
