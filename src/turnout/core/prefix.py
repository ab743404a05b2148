"""The prefix index: what each worker was recently sent, so that a request can go where the beginning of its
prompt is likely still in the engine's KV cache (llama.cpp, Ollama, vLLM and SGLang all keep it and skip the
prefill of what they hold).

A prompt (its parts as the worker will see them, :meth:`turnout.dialects.base.ClientAPI.prompt_parts`) is joined
and cut into blocks of ``block_bytes`` bytes (:func:`prompt_of`); each block's key hashes the block together with
the key before it, so one key stands for the whole prompt up to its block's end, as vLLM's and SGLang's caches
key their blocks. A partial last block gets no key.

:class:`PrefixIndex` is one worker's memory of what it was sent: keys from the least to the most recently sent,
each with the number of the send that last carried it. A key counts (:meth:`PrefixIndex.match`) while

- it is younger than ``ttl_s`` (engines evict too);
- for an engine that keeps one prompt per slot (llama.cpp's server, Ollama; llama-cpp-python's server keeps only
  its last prompt), it was carried by one of the worker's last ``slots`` sends;
- it is among the ``max_blocks`` most recently sent keys: the memory bound, and for a paged cache (vLLM, SGLang)
  the engine's capacity in blocks when that is smaller (the caller passes the smaller of the two).

For an engine with slots it also says what a send would push out (:attr:`Match.evicts`): the prompt in the slot
the engine reuses, when all of its slots hold prompts that still count; and how much of the prompt the worker was
sent within ``ttl_s`` whether or not a slot still holds it (:attr:`Match.history`): where a conversation group
went before, so that groups keep to their engines when none holds them any more.

It remembers sessions the same way (the client's own names for its conversations,
:meth:`turnout.dialects.base.ClientAPI.session_key`): the send that last carried each, and how long its prompt was.

Keys (and sessions) are 64-bit XXH3 hashes (the ``xxhash`` package), each block's seeded with the key before it:
the same on every process and machine, so gateway replicas share one index (Redis keeps it for them), and quicker
than Python's own ``hash`` of a block, which is salted per interpreter.

Pure: no clock (``now`` is a parameter), no I/O. One event loop owns an index; it is not thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from xxhash import xxh3_64_intdigest as _hash

__all__ = [
    "BYTES_PER_TOKEN",
    "NO_MATCH",
    "Match",
    "PrefixIndex",
    "Prompt",
    "match_of",
    "prompt_of",
]

BYTES_PER_TOKEN = 4  # what a token of English text or code takes, about: bytes -> tokens where no tokenizer is at hand
_JOIN = "\x1e"  # between parts: ["ab", "c"] and ["a", "bc"] are different prompts


class Prompt(NamedTuple):
    """One request's prompt as the index sees it."""

    keys: tuple[int, ...]  # one per whole block, each standing for the prompt up to that block's end
    size: int  # bytes of the joined prompt
    block: int  # block_bytes it was cut with
    session: int | None = None  # a hash of the client's name for its conversation, when it gives one

    @property
    def tokens(self) -> float:
        return self.size / BYTES_PER_TOKEN


class Match(NamedTuple):
    """What a worker is expected to hold of a prompt, in bytes: by the prefix index, and by the session; and, for
    an engine with slots, the size of the prompt that sending this one would push out of its cache."""

    prefix: int = 0
    session: int = 0
    evicts: int = 0
    history: int = 0  # bytes of the prompt sent here within the time limit, held in a slot or not
    evicts_age_s: float = 0.0  # how long ago the prompt ``evicts`` counts was sent

    @property
    def cached(self) -> int:
        return max(self.prefix, self.session)

    @property
    def by_session(self) -> bool:
        return self.session > self.prefix


NO_MATCH = Match()


def prompt_of(parts: Sequence[str], block_bytes: int, salt: str, session: str | None = None) -> Prompt:
    """Cut ``parts`` (joined) into blocks and chain their keys. ``salt``: the model, so that the same text sent for
    two models on one worker (two caches) is two prefixes."""
    data = _JOIN.join(parts).encode("utf-8", "replace")
    view = memoryview(data)
    seed = _hash(salt.encode("utf-8", "replace"))
    key = seed
    keys = []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        key = _hash(view[start : start + block_bytes], key)
        keys.append(key)
    return Prompt(tuple(keys), len(data), block_bytes, None if session is None else _hash(session.encode(), seed))


def match_of(
    prompt: Prompt,
    sends: Iterable[int | None],
    recent: int,
    latest: int,
    slots: int | None,
    session: tuple[int, int] | None,
    evicted: tuple[float, int] | None,
    now: float,
) -> Match:
    """What a worker holds of ``prompt``, from what its index says (one rule for the memory index and the one Redis
    keeps): ``sends``, the send that last carried each of the prompt's keys in order (None: none), read up to the
    first that does not count; ``recent``, the oldest send within the time limit; ``latest``, the last send;
    ``session``, (the send that last carried the prompt's session, that prompt's bytes); ``evicted``, (when, bytes)
    of the prompt this one would push out of an engine with ``slots`` (None: a free or stale slot, or no slots)."""
    oldest = recent if slots is None else max(recent, latest - slots + 1)
    matched = history = 0
    for send in sends:
        if send is None or send < recent:
            break
        history += 1
        if send >= oldest and matched == history - 1:
            matched = history
    held = 0
    if session is not None and session[0] >= oldest:
        held = min(session[1], prompt.size)
    evicts, age = 0, 0.0
    if evicted is not None:
        sent_at, evicts = evicted
        age = max(now - sent_at, 0.0)
    return Match(matched * prompt.block, held, evicts, history * prompt.block, age)


class PrefixIndex:
    """One worker's recently sent prompts (see the module's docstring). ``max_blocks``: keys kept at most;
    ``max_sessions``: sessions kept at most. Both are hard bounds on its memory."""

    __slots__ = ("_keys", "_send", "_sends", "_sessions", "max_blocks", "max_sessions")

    def __init__(self, max_blocks: int, max_sessions: int = 4096) -> None:
        if max_blocks < 1 or max_sessions < 1:
            raise ValueError("an index keeps at least one block and one session")
        self.max_blocks = max_blocks
        self.max_sessions = max_sessions
        self._keys: OrderedDict[int, int] = OrderedDict()  # key -> the send that last carried it
        # a session's hash -> (send, prompt bytes)
        self._sessions: OrderedDict[int, tuple[int, int]] = OrderedDict()
        # (send, time, prompt bytes) of the recent sends, oldest first: what ages keys out. A key whose send has
        # left this window no longer counts, so the window needs no more entries than there can be keys.
        self._sends: deque[tuple[int, float, int]] = deque(maxlen=max_blocks)
        self._send = 0

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def sends(self) -> int:
        return len(self._sends)

    def record(self, prompt: Prompt, now: float) -> None:
        """``prompt`` was sent to this worker at ``now``: its keys (and session) are now the most recent."""
        self._send += 1
        send = self._send
        self._sends.append((send, now, prompt.size))
        keys = self._keys
        # The deepest block first, so that the first block ends the most recent: the least recently sent keys go
        # first, and the deep end of an old prompt goes before its beginning (which other prompts may share).
        for key in reversed(prompt.keys):
            keys[key] = send
            keys.move_to_end(key)
        while len(keys) > self.max_blocks:
            keys.popitem(last=False)
        if prompt.session is not None:
            sessions = self._sessions
            sessions[prompt.session] = (send, prompt.size)
            sessions.move_to_end(prompt.session)
            if len(sessions) > self.max_sessions:
                sessions.popitem(last=False)

    def match(self, prompt: Prompt, now: float, ttl_s: float, slots: int | None = None) -> Match:
        """How much of ``prompt`` this worker is expected to hold: the bytes of its longest indexed prefix whose
        keys still count (see the module's docstring), the bytes its session's last prompt here had, and (with
        ``slots``) the bytes of the prompt this one would push out."""
        recent = self._oldest_recent(now, ttl_s)
        get = self._keys.get
        session = None if prompt.session is None else self._sessions.get(prompt.session)
        sends = self._sends
        evicted = None
        if slots is not None and len(sends) >= slots:  # every slot holds a prompt that still counts
            _, sent_at, size = sends[-slots]
            evicted = (sent_at, size)
        return match_of(prompt, (get(key) for key in prompt.keys), recent, self._send, slots, session, evicted, now)

    def _oldest_recent(self, now: float, ttl_s: float) -> int:
        """The number of the oldest send within ``ttl_s`` of ``now`` (older ones are dropped)."""
        sends = self._sends
        limit = now - ttl_s
        while sends and sends[0][1] < limit:
            sends.popleft()
        return sends[0][0] if sends else self._send + 1
