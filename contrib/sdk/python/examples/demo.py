#!/usr/bin/env python3
"""Cube's story through the Python SDK, against a running cube-api.

A sandbox runs a program that counts in its memory; the sandbox is
snapshotted; the program is SIGKILLed and a file deleted; a rollback in
place brings both back (the same PID, counting on from the snapshot's
value); a fork makes copies that start from that state and then diverge.
Every step is checked (exit 1 naming the one that did not hold) and timed;
everything made is removed at the end, also after a failure.

    CUBE_API_URL=http://127.0.0.1:3000 CUBE_API_KEY=... \\
        python3 contrib/sdk/python/examples/demo.py --template docker.io/library/busybox:latest

`make demo` runs it from the machine's shell against a cube-api in the test
host (contrib/scripts/demo.sh). Standard library only.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cube_sandbox import Sandbox, SandboxException, NotFoundException  # noqa: E402

# The program: a shell loop whose only state is i in its memory, mirrored to
# a file so the demo can read it.
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"
NOTES = "/tmp/notes.txt"


class StepFailed(Exception):
    pass


class Demo:
    def __init__(self, forks):
        self.forks = forks
        self.made = []
        self.snapshots = []
        self.step = 0

    def say(self, started, text):
        self.step += 1
        print("%d. %-88s %8.0f ms" % (self.step, text, (time.monotonic() - started) * 1000), flush=True)

    def count(self, sb):
        raw = sb.files.read("/tmp/count").strip()
        try:
            return int(raw)
        except ValueError:
            raise StepFailed("the counter file holds %r" % raw) from None

    def wait_count(self, sb, at_least):
        deadline = time.monotonic() + 60
        while True:
            try:
                n = self.count(sb)
                if n >= at_least:
                    return n
            except (SandboxException, StepFailed):
                n = None
            if time.monotonic() > deadline:
                raise StepFailed("%s: the counter does not reach %d in a minute (at %s)" % (sb.sandbox_id, at_least, n))
            time.sleep(0.2)

    @staticmethod
    def has_pid(sb, pid):
        return any(c.get("pid") == pid for c in sb.commands.list())

    def run(self, template):
        t = time.monotonic()
        sb = Sandbox.create(template=template, timeout=600, metadata={"demo": "python"})
        self.made.append(sb)
        self.say(t, "created sandbox %s from %s: its own microVM" % (sb.sandbox_id, template))

        t = time.monotonic()
        counter = sb.commands.run(COUNTER, background=True)
        counter.disconnect()
        pid = counter.pid
        n = self.wait_count(sb, 5)
        self.say(t, "a program (pid %d) counts in its memory: %d" % (pid, n))

        sb.files.write(NOTES, "draft 1\n")
        before = self.count(sb)
        t = time.monotonic()
        snap = sb.create_snapshot("before-experiment")
        self.snapshots.append(snap.snapshot_id)
        self.say(t, "snapshot %s: VM frozen %.0f ms, %d MiB; counter past %d"
                 % (snap.snapshot_id, snap.get("frozenMs", 0), snap.get("sizeBytes", 0) >> 20, before))

        t = time.monotonic()
        sb.commands.kill(pid, "SIGKILL")
        sb.files.remove(NOTES)
        deadline = time.monotonic() + 30
        while self.has_pid(sb, pid):
            if time.monotonic() > deadline:
                raise StepFailed("pid %d is still listed 30 s after SIGKILL" % pid)
            time.sleep(0.2)
        if sb.files.exists(NOTES):
            raise StepFailed("%s still exists after remove" % NOTES)
        self.say(t, "the experiment goes wrong: the program SIGKILLed, %s deleted" % NOTES)

        t = time.monotonic()
        rb = sb.rollback(snap.snapshot_id)
        if sb.files.read(NOTES) != "draft 1\n":
            raise StepFailed("after the rollback %s does not read 'draft 1'" % NOTES)
        if not self.has_pid(sb, pid):
            raise StepFailed("after the rollback the program (pid %d) is not listed" % pid)
        back = self.count(sb)
        if back < before:
            raise StepFailed("after the rollback the counter reads %d, below the snapshot's %d (a new process?)" % (back, before))
        self.say(t, "rolled back in place (VM frozen %.0f ms): pid %d is back at %d, %s is back"
                 % (rb.get("frozenMs", 0), pid, back, NOTES))
        self.wait_count(sb, back + 3)

        t = time.monotonic()
        results = sb.fork(self.forks, timeout=600, all_or_nothing=True)
        clones = [r.sandbox for r in results if r.sandbox is not None]
        self.made.extend(clones)
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise StepFailed("fork %d: %s" % (self.forks, "; ".join(str(e) for e in errors)))
        self.say(t, "forked %d copies of the running sandbox: %s" % (self.forks, ", ".join(c.sandbox_id for c in clones)))

        t = time.monotonic()
        for i, c in enumerate(clones):
            if c.files.read(NOTES) != "draft 1\n":
                raise StepFailed("clone %s: %s is not the source's" % (c.sandbox_id, NOTES))
            if not self.has_pid(c, pid):
                raise StepFailed("clone %s: the program (pid %d) is not listed" % (c.sandbox_id, pid))
            c.files.write(NOTES, "clone %d\n" % i)
            if i == 0:
                c.commands.kill(pid, "SIGKILL")  # this copy's program ends; the others' count on
        counts = []
        for i, c in enumerate(clones):
            if c.files.read(NOTES) != "clone %d\n" % i:
                raise StepFailed("clone %s: its own write does not read back" % c.sandbox_id)
            counts.append(self.count(c))
        time.sleep(2)
        later = [self.count(c) for c in clones]
        if later[0] != counts[0] or any(later[i] <= counts[i] for i in range(1, len(clones))):
            raise StepFailed("clones' counters %s then %s: want the first stopped, the others advancing" % (counts, later))
        if sb.files.read(NOTES) != "draft 1\n":
            raise StepFailed("the source's %s changed when the clones wrote theirs" % NOTES)
        self.say(t, "the copies diverge: own files, counters %s (the first one's program killed); source untouched" % later)

    def cleanup(self):
        t = time.monotonic()
        problems = []
        for sb in self.made:
            try:
                sb.kill()
            except NotFoundException:
                pass
            except SandboxException as e:
                problems.append("kill %s: %s" % (sb.sandbox_id, e))
        for sid in self.snapshots:
            try:
                Sandbox.delete_snapshot(sid)
            except NotFoundException:
                pass
            except SandboxException as e:
                problems.append("delete snapshot %s: %s" % (sid, e))
        self.say(t, "cleaned up: %d sandboxes killed, %d snapshots deleted" % (len(self.made), len(self.snapshots)))
        return problems


def main():
    p = argparse.ArgumentParser(description="Snapshot, roll back and fork a running sandbox through cube-api "
                                            "with the Python SDK (CUBE_API_URL, CUBE_API_KEY).")
    p.add_argument("--template", default=os.environ.get("CUBE_TEMPLATE_ID"),
                   help="image or template id to start from; it needs /bin/sh and sleep (env CUBE_TEMPLATE_ID)")
    p.add_argument("--fork", type=int, default=3, help="how many copies to fork (default 3)")
    a = p.parse_args()
    if not a.template:
        p.error("--template is required: an image imported into cube-api's namespace, or a template id")
    if a.fork < 1:
        p.error("--fork must be at least 1")
    print("Cube demo: the Python SDK against cube-api at %s" % os.environ.get("CUBE_API_URL", "http://127.0.0.1:3000"), flush=True)
    d = Demo(a.fork)
    failure = None
    try:
        d.run(a.template)
    except (StepFailed, SandboxException) as e:
        failure = e
    problems = d.cleanup()
    if failure is not None:
        print("demo: FAILED: %s" % failure, file=sys.stderr)
        return 1
    if problems:
        print("demo: cleanup left: %s" % "; ".join(problems), file=sys.stderr)
        return 1
    print("demo: every step held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
