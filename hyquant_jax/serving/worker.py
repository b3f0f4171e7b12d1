"""`EngineWorker`: one thread that owns an `Engine` (and so JAX), fed through a thread-safe queue.

Other threads (the HTTP server's event loop) `submit` requests and `cancel` them; each request's events reach
its `deliver` callback, called from the worker thread:

    ("accepted", None)          the engine queued it
    ("error", exception)        refused (ValueError: a bad request; QueueFull) or failed (any other exception)
    ("update", Update)          new tokens and text; the last one has a finish_reason
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import traceback
from collections.abc import Callable

from hyquant_jax.serving.engine import Engine


@dataclasses.dataclass(eq=False)
class Ticket:
    """A submitted request, as its submitter knows it (the engine's id is assigned in the worker thread)."""

    deliver: Callable[[tuple], None]
    request_id: int | None = None
    done: bool = False


class EngineWorker:
    """Runs `engine.step()` in a background thread while requests run; applies submissions and cancellations
    between steps, in the order they came."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.Queue = queue.Queue()
        self._tickets: dict[int, Ticket] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hyquant-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout)

    def submit(self, prompt, deliver: Callable[[tuple], None], **request) -> Ticket:
        """Queue `engine.add_request(prompt, **request)`; its events go to deliver (see module docstring)."""
        ticket = Ticket(deliver)
        self._inbox.put(("add", ticket, prompt, request))
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Cancel a submitted request (no effect once it finished); its slot is freed before the next step."""
        self._inbox.put(("cancel", ticket))

    def _loop(self) -> None:
        while not self._stop.is_set():
            commands = [] if self.engine.busy else [self._inbox.get()]  # idle: wait for work (or `stop`)
            while True:
                try:
                    commands.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if command is not None:
                    self._apply(command)
            if self.engine.busy and not self._stop.is_set():
                self._step()

    def _apply(self, command) -> None:
        if command[0] == "add":
            _, ticket, prompt, request = command
            try:
                ticket.request_id = self.engine.add_request(prompt, **request)
            except Exception as e:  # a refused request: only its submitter hears of it
                ticket.done = True
                _send(ticket, ("error", e))
                return
            self._tickets[ticket.request_id] = ticket
            _send(ticket, ("accepted", None))
        elif command[0] == "cancel":
            ticket = command[1]
            if ticket.request_id is not None and self.engine.cancel(ticket.request_id):
                self._close(ticket.request_id)

    def _step(self) -> None:
        try:
            updates = self.engine.step()
        except Exception as e:  # a failed step: every running request hears of it, the engine starts afresh
            traceback.print_exc()
            for rid in self.engine.reset():
                if rid in self._tickets:
                    _send(self._tickets[rid], ("error", e))
                    self._close(rid)
            return
        for rid, update in updates.items():
            ticket = self._tickets.get(rid)
            if ticket is not None:
                _send(ticket, ("update", update))
            if update.finish_reason is not None:
                self._close(rid)

    def _close(self, rid: int) -> None:
        self.engine.pop_result(rid)
        ticket = self._tickets.pop(rid, None)
        if ticket is not None:
            ticket.done = True


def _send(ticket: Ticket, event: tuple) -> None:
    try:
        ticket.deliver(event)
    except Exception:  # e.g. the submitter's event loop has closed: nobody listens any more
        pass
