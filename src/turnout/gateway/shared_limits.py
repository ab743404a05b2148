"""Rate windows and token budgets of `turnout serve --workers N`, kept by its supervisor for every process.

The supervisor holds one :class:`turnout.core.limits.KeyLimitState` per subject (a key's rotation chain, a
tenant), as a single process does in memory, and each gateway process asks it over a socket pair made before
the process was forked (:class:`LimitKeeper`, :class:`SharedLimiter`). One keeper decides every admission, so
the limits are exact across the processes, and an admission costs the asking process a message and its answer
(about 15 us of the supervisor's CPU and 10-25 us of the process's, bench/README.md) instead of a store
transaction. Like a single process's counts, they
start over when the gateway restarts (a crashed process's restart keeps them: the supervisor holds them);
``storage.redis_url`` keeps them across restarts and replicas.

Frames: a 4-byte big-endian length, then a JSON array. A process sends ``[n, "admit", subject, rpm, daily,
estimate]`` and the keeper answers ``[n, <the Decision's fields>]``; ``[0, "settle", subject, day, reserved,
actual]`` and ``[0, "release", subject, day, at, reserved]`` get no answer (they are applied in the order they
were sent, after the admission they belong to). Admission times are the keeper's clock, so the window is one
sequence whatever process asked.

The same channel carries each process's ``occ.*`` messages about its requests in flight and its waiters, which the
keeper hands to its :attr:`LimitKeeper.occupancy` (:mod:`turnout.gateway.supervised`), and the keeper's ``[0,
"occ.wake", ticket]`` to a process whose waiter goes first and ``[0, "occ.stop", lease]`` to one whose batch request
another process stops (:attr:`SharedLimiter.on_told`). With
``storage.redis_url`` the limits and the occupancy are Redis's, and the channel carries nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, KeysView
from typing import Any, Protocol

import orjson

from turnout.core.limits import Decision, KeyLimitState
from turnout.errors import Unavailable
from turnout.gateway.limiter import Subject, refusal

__all__ = ["LimitKeeper", "SharedLimiter"]

log = logging.getLogger("turnout.serve")

_HEAD = struct.Struct("!I")
_MAX_FRAME = 64 << 10  # a frame is a few hundred bytes: anything near this is a broken peer
_ANSWER_S = 5.0  # an admission the keeper has not answered in this time is refused as "limits unavailable"


def _frame(message: list[Any]) -> bytes:
    data = orjson.dumps(message)
    return _HEAD.pack(len(data)) + data


def _unavailable(why: str | None) -> Unavailable:
    """A limited request's 503 when the keeper cannot answer it (fail closed, as with Redis)."""
    return Unavailable(
        f"limits unavailable: {why} (the supervisor of `turnout serve --workers` counts them)",
        code="limits_unavailable",
        retry_after=5,
    )


class _Frames:
    """Splits a byte stream into frames (length, then that many bytes)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes. Raises ValueError for a length no peer of ours sends."""
        buffer = self._buffer + data if self._buffer else data
        out: list[bytes] = []
        start = 0
        while len(buffer) - start >= _HEAD.size:
            (size,) = _HEAD.unpack_from(buffer, start)
            if size > _MAX_FRAME:
                raise ValueError(f"a frame of {size} bytes")
            end = start + _HEAD.size + size
            if end > len(buffer):
                break
            out.append(buffer[start + _HEAD.size : end])
            start = end
        self._buffer = buffer[start:]
        return out


class _Occupancy(Protocol):
    """What the keeper hands ``occ.*`` messages to (:class:`turnout.gateway.supervised.OccupancyKeeper`)."""

    def apply(self, fd: int, message: list[Any]) -> list[Any] | None: ...

    def gone(self, fd: int) -> None: ...


class LimitKeeper:
    """The supervisor's side: the limit states, and one socket per gateway process. With ``occupancy`` set, it also
    answers the processes' ``occ.*`` messages (their requests in flight and wait queue) through it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._states: dict[str, KeyLimitState] = {}
        self._peers: dict[int, tuple[socket.socket, _Frames]] = {}  # by the file descriptor of the keeper's end
        self.occupancy: _Occupancy | None = None

    def send(self, fd: int, message: list[Any]) -> None:
        """Tell one process something (the occupancy wakes its waiter)."""
        peer = self._peers.get(fd)
        if peer is None:
            return
        try:
            peer[0].sendall(_frame(message))
        except OSError as exc:  # it stopped reading (the socket's timeout) or ended
            self._drop(fd, exc)

    def connect(self) -> socket.socket:
        """A new socket pair (before a process is forked): the keeper keeps one end, the process gets the other."""
        ours, theirs = socket.socketpair()
        ours.settimeout(1.0)  # a process that stops reading its answers is dropped, not waited for
        self._peers[ours.fileno()] = (ours, _Frames())
        return theirs

    @property
    def fds(self) -> KeysView[int]:
        """The file descriptors of the keeper's ends (to select on, then :meth:`serve`)."""
        return self._peers.keys()

    def close(self) -> None:
        """Close the keeper's ends (in the supervisor when it stops; in a forked process, which has no use for them)."""
        for sock, _ in self._peers.values():
            sock.close()
        self._peers.clear()

    def serve(self, fd: int) -> None:
        """``fd`` is readable: apply what arrived and answer it; a closed or broken peer is dropped."""
        peer = self._peers.get(fd)
        if peer is None:
            return
        sock, frames = peer
        try:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError("the gateway process closed its end")
            answers = []
            for frame in frames.feed(data):
                answer = self._apply(frame, fd)
                if answer is not None:
                    answers.append(answer)
            if answers:
                sock.sendall(b"".join(answers))
        except (OSError, ValueError) as exc:  # the process ended (or misbehaved): its end is gone
            self._drop(fd, exc)

    def _drop(self, fd: int, exc: Exception) -> None:
        peer = self._peers.pop(fd, None)
        if peer is None:
            return
        if not isinstance(exc, ConnectionResetError):
            log.warning("dropping a gateway process's limits channel: %s", exc)
        peer[0].close()
        if self.occupancy is not None:
            self.occupancy.gone(fd)  # its requests in flight ended with it

    def _apply(self, frame: bytes, fd: int) -> bytes | None:
        message = orjson.loads(frame)
        n, op = message[0], message[1]
        if op.startswith("occ."):
            if self.occupancy is None:
                raise ValueError(f"{op!r} without an occupancy here")
            answer = self.occupancy.apply(fd, message)
            return None if answer is None else _frame(answer)
        subject = message[2]
        state = self._states.get(subject)
        if state is None:
            state = self._states[subject] = KeyLimitState()
        if op == "admit":
            _, _, _, rpm, daily, estimate = message
            decision = state.admit(self._clock(), rpm, daily, estimate)
            return _frame([n, *decision])  # a named tuple: its fields in order
        if op == "settle":
            _, _, _, day, reserved, actual = message
            state.settle(day, reserved, actual)
        elif op == "release":
            _, _, _, day, at, reserved = message
            state.release(Decision(True, day=day, at=at), reserved)
        else:
            raise ValueError(f"unknown operation {op!r}")
        return None


class SharedLimiter:
    """A gateway process's side (a :class:`turnout.gateway.limiter.TokenLimiter`): asks the keeper over
    ``sock``, its end of the pair the supervisor made for it, and hands what the keeper tells it unasked to
    ``on_told``; :meth:`listen` starts reading before anything is sent."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._frames = _Frames()
        self._waiting: dict[int, asyncio.Future[list[Any]]] = {}
        self._asked: dict[int, float] = {}  # when each waiting admission was sent (loop time), oldest first
        self._sweep: asyncio.TimerHandle | None = None  # expires the unanswered ones (one timer, not one each)
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broken: str | None = None
        self.on_told: Callable[[list[Any]], None] | None = None  # what the keeper says unasked (``[0, ...]``)

    def listen(self) -> None:
        """Read the channel from now on (on the process's event loop; :meth:`_send` starts it too)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._sock.fileno(), self._on_readable)

    def _send(self, message: list[Any]) -> None:
        self.listen()  # the first call, on the process's event loop
        if self._broken is not None:
            raise _unavailable(self._broken)
        try:
            self._sock.sendall(_frame(message))  # a few hundred bytes into a local socket: it has room
        except OSError as exc:  # BlockingIOError included: the keeper stopped reading
            self._fail(f"cannot reach the supervisor: {exc}")
            raise _unavailable(self._broken) from None

    def _on_readable(self) -> None:
        try:
            data = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"the supervisor's channel broke: {exc}")
            return
        if not data:
            self._fail("the supervisor closed its channel")
            return
        try:
            frames = self._frames.feed(data)
        except ValueError as exc:
            self._fail(f"the supervisor sent {exc}")
            return
        for frame in frames:
            message = orjson.loads(frame)
            if message[0] == 0:  # not an answer: the keeper says something unasked
                if self.on_told is not None:
                    self.on_told(message)
                continue
            future = self._waiting.pop(message[0], None)
            if future is not None and not future.done():
                future.set_result(message)

    def _fail(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
            log.error("limits unavailable: %s", why)
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_unavailable(self._broken))
        self._waiting.clear()
        self._asked.clear()

    def _expire(self) -> None:
        """Refuse the admissions the keeper has not answered in ``_ANSWER_S`` (checked a few times that long)."""
        self._sweep = None
        assert self._loop is not None
        limit = self._loop.time() - _ANSWER_S
        for n, asked in list(self._asked.items()):
            if asked > limit:
                break  # the rest were sent later
            del self._asked[n]
            future = self._waiting.pop(n, None)
            if future is not None and not future.done():
                future.set_exception(_unavailable(f"the supervisor did not answer within {_ANSWER_S:g} s"))
        if self._asked:
            self._sweep = self._loop.call_later(_ANSWER_S / 5, self._expire)

    async def ask(self, op: str, *fields: Any) -> list[Any]:
        """Send ``[n, op, *fields]`` and the keeper's answer (``[n, ...]``); Unavailable when none comes in time."""
        self._next += 1
        n = self._next
        self._send([n, op, *fields])
        assert self._loop is not None
        loop = self._loop
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._waiting[n] = future
        self._asked[n] = loop.time()
        if self._sweep is None:
            self._sweep = loop.call_later(_ANSWER_S / 5, self._expire)
        try:
            return await future
        finally:
            self._waiting.pop(n, None)
            self._asked.pop(n, None)

    def tell(self, op: str, *fields: Any) -> None:
        """Send ``[0, op, *fields]`` (no answer); dropped when the channel is broken."""
        with contextlib.suppress(Unavailable):
            self._send([0, op, *fields])

    async def admit(self, subject: Subject, estimate: int) -> Decision:
        answer = await self.ask("admit", subject.id, subject.rpm, subject.daily_tokens, estimate)
        decision = Decision(*answer[1:])
        if not decision.allowed:
            raise refusal(decision, subject.label)
        return decision

    async def settle(self, subject: Subject, decision: Decision, reserved: int, actual: int) -> None:
        if subject.daily_tokens is None or actual == reserved:
            return
        # A lost settlement only errs on the strict side: the reservation stays counted.
        with contextlib.suppress(Unavailable):
            self._send([0, "settle", subject.id, decision.day, reserved, actual])

    async def release(self, subject: Subject, decision: Decision, reserved: int) -> None:
        with contextlib.suppress(Unavailable):
            reserve = reserved if subject.daily_tokens is not None else 0
            self._send([0, "release", subject.id, decision.day, decision.at, reserve])

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        if self._loop is not None and self._broken is None:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
