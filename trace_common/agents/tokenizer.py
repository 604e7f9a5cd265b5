"""The `micro` base agent's tokenizer: byte-level BPE trained on the built-in domain's text.

A model trained from scratch on one domain needs no 50k-token vocabulary: a few thousand
merges learned from the domain's own text (policy, tool signatures, rendered expert
conversations) keep sequences short and the embedding small. Digit runs are cut into
fixed pairs ("65817" -> "65" "81" "7") before BPE, wherever they occur: an id is then
the same token sequence in a user message, a tool result and a tool call (a model that
copies ids can match them token for token), every id is representable (all 100 pairs are
in the vocabulary), and an id costs 3 tokens instead of 5. With one token per digit,
a from-scratch model learns to copy much more slowly: each digit token recurs all over
the context, so matching one token finds the wrong source. For the same reason every
whitespace character is its own token: byte-level BPE otherwise glues a leading space to
words, so "mason" in "my email is mason.moreau61@..." and in '{"email": "mason...' would be
different tokens, and copying a name would need a learned mapping instead of a match.
It costs about a quarter more tokens. ChatML markers are special
tokens; `<tool_call>` / `</tool_call>` are single (non-special) added tokens, so decoding
keeps them and a call always starts with one unambiguous token.

The result is a `PreTrainedTokenizerFast` carrying `TRACE_CHATML_TEMPLATE` as its chat
template, saved with the model like any HF tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from trace_common.errors import InvalidArgument
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TOOL_TOKENS = ("<tool_call>", "</tool_call>")


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, model_max_length: int = 4096
                    ) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` (see the module docstring); at most
    `vocab_size` tokens in all (a small domain may need fewer)."""
    if vocab_size < 300:
        raise InvalidArgument(field="vocab_size", expected="at least 300 (256 bytes + special tokens + merges)",
                              got=vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"\d{1,2}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TOOL_TOKENS), min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN,
                                   model_max_length=model_max_length, padding_side="left",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = TRACE_CHATML_TEMPLATE
    return fast
