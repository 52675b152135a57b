"""What the Tokenize and Detokenize RPCs compute from a generative model's tokenizer: the prompt's token ids
as a Generate of the same prompt would see them (text encoded, a conversation rendered by the model's chat
template with its tools), and the text of token ids. Runs on the event loop, as a Generate's tokenizing
does (server/batching/requests.py): one tokenizer call, no model step."""

from __future__ import annotations

from collections.abc import Sequence

from server.batching.requests import check_vocabulary
from server.domain import TokenizeSpec
from server.errors import InvalidArgument, SluiceError, clip
from server.runtimes.base import GenerativeModel


def tokenize(model: GenerativeModel, spec: TokenizeSpec) -> list[int]:
    """The token ids; a conversation the chat template refuses (a template may raise on roles out of order)
    is INVALID_ARGUMENT naming the messages, with the template's own words."""
    if spec.chat is None:
        return model.tokenize(spec.text or "", add_special_tokens=spec.add_special_tokens)
    try:
        return model.chat_tokens(spec.chat, spec.tools, add_generation_prompt=spec.add_generation_prompt)
    except SluiceError:
        raise
    except Exception as exc:  # jinja2's TemplateError, a template's raise_exception(), a tokenizer's own
        raise InvalidArgument(
            f"the model's chat template refused the conversation: {clip(str(exc))}", field="chat.messages"
        ) from None


def detokenize(model: GenerativeModel, token_ids: Sequence[int]) -> str:
    """The text; a token id outside the vocabulary is refused naming its position."""
    check_vocabulary(token_ids, model.vocab_size, "token_ids")
    return model.detokenize(token_ids)
