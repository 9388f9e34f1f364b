"""The length limits a request must meet before it reaches the engine, checked as vLLM
0.32 (the vLLM backend's pinned version) checks them and refused in its words, so a caller
sees the same 400 whichever backend serves the endpoint:

1. the requested output (`max_tokens`, or chat's `max_completion_tokens`) may not exceed
   the max model length;
2. a prompt text longer than `max_model_len * max_chars_per_token` characters (an upper
   bound on any text of `max_model_len` tokens) is refused without being tokenized;
3. the prompt is tokenized to at most `max_model_len + 1` tokens: more than
   `max_model_len` is refused ("at least" that many, as the count stopped there);
4. the output budget is `min(max_tokens or the default, max_model_len - prompt tokens)`
   (vLLM clamps a request whose prompt plus max_tokens overflows the context; it does not
   refuse it), and a budget below 1 is refused.

5. with the container's MAX_INPUT_LENGTH, a prompt of more tokens is refused naming it.

Refused requests never reach the engine's queue (`EmbeddedServer` checks before
`Runner.stream`). vLLM appends the parameter and value to each message; so does
`LimitError`.
"""

from __future__ import annotations

from typing import Any


class LimitError(ValueError):
    """A request over a limit: vLLM's VLLMValidationError, a 400 with `param`."""

    def __init__(self, message: str, param: str, value: int) -> None:
        super().__init__(f"{message} (parameter={param}, value={value})")
        self.param = param


def max_chars_per_token(tokenizer: Any) -> int:
    """The longest vocabulary entry, in characters (vLLM's bound for rule 2)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def check_output(requested: int | None, param: str, max_model_len: int) -> None:
    """Rule 1."""
    if requested is not None and requested > max_model_len:
        raise LimitError(f"{param}={requested} cannot be greater than "
                         f"max_model_len={max_model_len}. Please request fewer output tokens.",
                         param, requested)


def check_text(text: str, max_model_len: int, chars_per_token: int) -> None:
    """Rule 2."""
    bound = max_model_len * chars_per_token
    if len(text) > bound:
        raise LimitError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(text)} characters (more than {bound} characters, which is "
            f"the upper bound for {max_model_len} input tokens). Please reduce the length of "
            f"the input prompt.", "input_text", len(text))


def check_tokens(count: int, max_model_len: int) -> None:
    """Rule 3, for a prompt tokenized to at most `max_model_len + 1` tokens."""
    if count > max_model_len:
        qualifier = "at least " if count == max_model_len + 1 else ""
        raise LimitError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
            f"without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens", count)


def check_input(count: int, max_input_length: int | None) -> None:
    """The container's MAX_INPUT_LENGTH (TGI's longest prompt), when it set one."""
    if max_input_length is not None and count > max_input_length:
        raise LimitError(
            f"The prompt contains {count} input tokens, more than MAX_INPUT_LENGTH="
            f"{max_input_length} allows. Please reduce the length of the input prompt.",
            "input_tokens", count)


def output_budget(prompt_tokens: int, requested: int | None, default: int,
                  max_model_len: int) -> int:
    """Rule 4: the tokens the request may generate."""
    budget = min(max_model_len - prompt_tokens,
                 requested if requested is not None else default)
    if budget < 1:
        raise LimitError(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    return budget
