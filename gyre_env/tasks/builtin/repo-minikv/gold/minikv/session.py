"""A client session: transactions, snapshots and line handling."""

from minikv.persist import save_snapshot
from minikv.protocol import CommandError, Status, format_reply, tokenize
from minikv.store import OK, check_arity

SESSION_COMMANDS = {"multi": (0, 0), "exec": (0, 0), "discard": (0, 0), "save": (0, 0)}


class Session:
    def __init__(self, store, snapshot_path=None):
        self.store = store
        self.snapshot_path = snapshot_path
        self.queue = None  # a list while a transaction is open
        self.failed = False

    def execute(self, args):
        try:
            return self._execute(args)
        except CommandError as e:
            return e

    def _execute(self, args):
        if not args:
            raise CommandError("ERR empty command")
        name = args[0].lower()
        if self.queue is not None and name not in ("exec", "discard", "multi"):
            try:
                check_arity(args, SESSION_COMMANDS)
            except CommandError:
                self.failed = True
                raise
            self.queue.append(list(args))
            return Status("QUEUED")
        check_arity(args, SESSION_COMMANDS)
        if name == "multi":
            if self.queue is not None:
                raise CommandError("ERR MULTI calls can not be nested")
            self.queue, self.failed = [], False
            return OK
        if name in ("exec", "discard"):
            if self.queue is None:
                raise CommandError(f"ERR {name.upper()} without MULTI")
            queue, failed = self.queue, self.failed
            self.queue, self.failed = None, False
            if name == "discard":
                return OK
            if failed:
                raise CommandError("EXECABORT Transaction discarded because of previous errors.")
            return [self.execute(cmd) for cmd in queue]
        if name == "save":
            if self.snapshot_path is None:
                raise CommandError("ERR no snapshot path configured")
            save_snapshot(self.store, self.snapshot_path)
            return OK
        return self.store.execute(*args)

    def run_line(self, line):
        if not line.strip() or line.lstrip().startswith("#"):
            return None
        try:
            args = tokenize(line)
        except CommandError as e:
            return format_reply(e)
        return format_reply(self.execute(args))
