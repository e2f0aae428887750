"""Synthetic prompts for `profiler replay` that share prefixes the way agent sessions do.

An agent's next prompt is its previous context plus what came back: the previous prompt, the
model's answer, then new text (a tool result, a new instruction). The replayer rebuilds that
shape without the original text:

    messages(call) = messages(base) + [assistant: base's actual reply] + [user: new words]

where ``base`` is the largest already-finished context that fits the recorded prompt — one of
the call's parents or the same agent's previous call — and the number of new words is
``input_tokens - context_tokens(base)`` (one word ≈ one token: the words are short, common
English words that byte-level BPE vocabularies hold as single tokens). When the whole context
does not fit (the recorded prompt shrank: history trimmed, another agent's view), the longest
start of it that fits is shared instead — the prompt without the reply, or its first messages
— and only a call shorter than every such start begins a fresh conversation. Prefix caches
(SGLang's radix tree, vLLM's prefix caching) therefore see about the reuse the original calls
had.

``context_tokens`` uses the engine's own count when it answered (``usage.prompt_tokens`` +
``usage.completion_tokens``), so the sizing follows the target's tokenizer; otherwise the word
count plus :data:`MESSAGE_OVERHEAD` per message.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

#: Tokens a chat template adds per message (role markers), for sizing before the engine answered.
MESSAGE_OVERHEAD = 4

WORDS: tuple[str, ...] = tuple("""
the of and to in is it you that he was for on are with as his they be at one have this from or
had by not word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run while press close night real life few north open seem together next
white children begin got walk example ease paper group always music those both mark often letter
until mile river car feet care second book carry took science eat room friend began idea fish
mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour better
true during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit power town
""".split())


def words(n: int, key: str, seed: int) -> str:
    """``n`` pseudo-random words, the same for the same ``(key, seed)``."""
    if n <= 0:
        return ""
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    return " ".join(np.asarray(WORDS)[rng.integers(0, len(WORDS), n)])


@dataclass
class Context:
    """A finished call's conversation: what was sent, what came back, and their sizes in tokens
    (the engine's count when it answered)."""
    messages: list[dict] = field(default_factory=list)
    reply: str = ""
    prompt_tokens: int = 0
    reply_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.reply_tokens

    def continued(self) -> list[dict]:
        """The messages a follow-up call starts from."""
        if not self.reply:
            return list(self.messages)
        return [*self.messages, {"role": "assistant", "content": self.reply}]

    def prefixes(self) -> list[tuple[list[dict], int]]:
        """Shareable starts of this conversation, longest first, with their sizes: the whole
        context with the reply, the prompt alone, then ever shorter runs of its messages (an
        agent that trims its history keeps the start: system prompt, task)."""
        out = [(self.continued(), self.tokens + (MESSAGE_OVERHEAD if self.reply else 0)),
               (list(self.messages), self.prompt_tokens)]
        for k in range(len(self.messages) - 1, 0, -1):
            out.append((self.messages[:k], estimate_tokens(self.messages[:k])))
        return out


def estimate_tokens(messages: list[dict]) -> int:
    return sum(len(str(m.get("content", "")).split()) + MESSAGE_OVERHEAD for m in messages)


def build_messages(input_tokens: int, candidates: list[Context], key: str, seed: int) -> list[dict]:
    """The prompt for one call: the largest shareable prefix of a candidate that fits, plus new words.

    ``candidates`` are the finished contexts this call may continue (parents, the same agent's
    previous call). Returns OpenAI chat messages whose size is about ``input_tokens``.
    """
    room = input_tokens - MESSAGE_OVERHEAD
    best: tuple[list[dict], int] | None = None
    for c in candidates:
        for msgs, size in c.prefixes():
            if size <= room and (best is None or size > best[1]):
                best = (msgs, size)
                break                      # prefixes() is longest first
    if best is None:
        return [{"role": "user", "content": words(max(1, room), key, seed)}]
    return [*best[0], {"role": "user", "content": words(max(1, room - best[1]), key, seed)}]
