#!/usr/bin/python3
"""events_sub.py: a subscriber of kvcached's KV event stream written to vLLM's
schema, driven by tests/integration/events.c (doc/events.md).

It receives as vLLM's examples/online_serving/kv_events_subscriber.py does:
a SUB socket gets [topic, seq (8 bytes, big-endian), payload]; a gap in the
sequence numbers asks the replay socket for the batches from last + 1 (a
DEALER sends ["", start]; each answer is ["", seq, payload], the end marker
["", -1, ""]), then goes on with the live batch. Each payload is decoded as
msgspec decodes vLLM's KVEventBatch: an array [ts, events, dp_rank?] whose
events are tagged arrays (vLLM before its map encoding) or tagged maps
(--format map); any departure is an "E" line. Lines printed (one per batch,
then one per event):

  B <seq> <nevents>            a live batch        P <seq> <nevents>  a replayed one
  S <parent|-> <h,h,...> <block_size> <medium> <tokens|->   BlockStored
  R <medium> <h,h,...>                                       BlockRemoved
  C                                                          AllBlocksCleared
  P end                        the end of a replay
  E <why>                      the stream broke vLLM's schema (the test fails)

Hashes print as hex (bytes) or decimal (ints). With --vllm-seed S every
stored hash is checked against vLLM's sha256_cbor chain from the token ids.
Commands on stdin: pause (close the SUB socket), resume (a new one), replay N,
quit. --slow: subscribe with a receive high-water mark of 1 and never read.
"""
import argparse
import hashlib
import os
import sys

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class SchemaError(Exception):
    pass


def need(cond, why):
    if not cond:
        raise SchemaError(why)


def is_hash(h):
    return isinstance(h, bytes) or (isinstance(h, int) and not isinstance(h, bool))


def hexh(h):
    return h.hex() if isinstance(h, bytes) else str(h)


# Field order of vLLM's structs (msgspec array_like: the tag, then these).
STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name"]
STORED_REQUIRED = 6  # lora_name came later: older subscribers stop at medium
REMOVED = ["block_hashes", "medium"]


def fields(ev, names, required, fmt):
    """The named fields of one event, as msgspec reads an array_like or a
    map-encoded struct: extra trailing elements or unknown keys are ignored,
    a missing required field is an error."""
    if fmt == "array":
        need(isinstance(ev, list), "an event is not an array: %r" % (ev,))
        need(len(ev) - 1 >= required, "%s has %d fields, needs %d" % (ev[0], len(ev) - 1, required))
        return {n: (ev[1 + i] if 1 + i < len(ev) else None) for i, n in enumerate(names)}
    need(isinstance(ev, dict), "an event is not a map: %r" % (ev,))
    for n in names[:required]:
        need(n in ev, "%s lacks %s" % (ev.get("type"), n))
    return {n: ev.get(n) for n in names}


def tag(ev, fmt):
    if fmt == "array":
        need(isinstance(ev, list) and ev and isinstance(ev[0], str), "untagged event %r" % (ev,))
        return ev[0]
    need(isinstance(ev, dict) and isinstance(ev.get("type"), str), "untagged event %r" % (ev,))
    return ev["type"]


class Checker:
    """vLLM's block hashes recomputed from token ids (sha256_cbor); an int
    hash is the bytes hash's last 8 bytes, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""

    def __init__(self, seed):
        import cbor2
        self.cbor2 = cbor2
        self.none = self.h(seed)
        self.known = {}  # an int hash published -> the bytes it was made of

    def h(self, x):
        return hashlib.sha256(self.cbor2.dumps(x, canonical=True)).digest()

    def check(self, f):
        p = f["parent_block_hash"]
        if p is None:
            parent = self.none
        elif isinstance(p, bytes):
            parent = p
        else:
            need(p in self.known, "parent %d was never stored" % p)
            parent = self.known[p]
        bs, toks = f["block_size"], f["token_ids"]
        for i, got in enumerate(f["block_hashes"]):
            want = self.h((parent, tuple(toks[i * bs:(i + 1) * bs]), None))
            if isinstance(got, int):
                need(got == int.from_bytes(want, "big") & ((1 << 64) - 1),
                     "block %d: int hash %d is not vLLM's for %s" % (i, got, want.hex()))
                self.known[got] = want
            else:
                need(got == want, "block %d: hash %s, vLLM's sha256_cbor gives %s"
                     % (i, hexh(got), want.hex()))
            parent = want


def decode(payload, fmt, checker):
    """Lines for one batch: its events, checked against the schema."""
    b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    need(isinstance(b, list) and 2 <= len(b) <= 3, "a batch is [ts, events, dp_rank]: %r" % (b,))
    need(isinstance(b[0], float), "ts is not a float: %r" % (b[0],))
    need(isinstance(b[1], list), "events is not a list")
    if len(b) == 3:
        need(b[2] is None or (isinstance(b[2], int) and not isinstance(b[2], bool)),
             "data_parallel_rank is not an int")
    lines = []
    for ev in b[1]:
        t = tag(ev, fmt)
        if t == "BlockStored":
            f = fields(ev, STORED, STORED_REQUIRED, fmt)
            hs, parent, toks, bs = f["block_hashes"], f["parent_block_hash"], f["token_ids"], f["block_size"]
            need(isinstance(hs, list) and hs and all(is_hash(h) for h in hs), "block_hashes")
            need(parent is None or is_hash(parent), "parent_block_hash")
            need(isinstance(toks, list) and all(isinstance(t, int) for t in toks), "token_ids")
            need(isinstance(bs, int) and bs > 0, "block_size")
            need(not toks or len(toks) == bs * len(hs), "token_ids: %d for %d blocks of %d"
                 % (len(toks), len(hs), bs))
            need(f["lora_id"] is None or isinstance(f["lora_id"], int), "lora_id")
            need(f["medium"] is None or isinstance(f["medium"], str), "medium")
            need(f["lora_name"] is None or isinstance(f["lora_name"], str), "lora_name")
            if checker:
                checker.check(f)
            lines.append("S %s %s %d %s %s" % (hexh(parent) if parent is not None else "-",
                                               ",".join(hexh(h) for h in hs), bs, f["medium"],
                                               ",".join(map(str, toks)) if toks else "-"))
        elif t == "BlockRemoved":
            f = fields(ev, REMOVED, 1, fmt)
            hs = f["block_hashes"]
            need(isinstance(hs, list) and hs and all(is_hash(h) for h in hs), "block_hashes")
            need(f["medium"] is None or isinstance(f["medium"], str), "medium")
            lines.append("R %s %s" % (f["medium"], ",".join(hexh(h) for h in hs)))
        elif t == "AllBlocksCleared":
            lines.append("C")
        else:
            raise SchemaError("unknown event %r" % (t,))
    return lines


class Sub:
    def __init__(self, a):
        self.a = a
        self.ctx = zmq.Context()
        self.sub = None
        self.replay = None
        self.last = -1
        self.checker = Checker(a.vllm_seed) if a.vllm_seed is not None else None
        self.open()
        if a.replay:
            self.replay = self.ctx.socket(zmq.DEALER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.connect(a.replay)

    def open(self):
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        if self.a.slow:
            self.sub.setsockopt(zmq.RCVHWM, 1)
            self.sub.setsockopt(zmq.RCVBUF, 4096)
        self.sub.connect(self.a.endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.a.topic.encode())

    def batch(self, kind, seq, payload):
        try:
            lines = decode(payload, self.a.format, self.checker)
        except SchemaError as e:
            out("E seq %d: %s" % (seq, e))
            return
        out("%s %d %d" % (kind, seq, len(lines)))
        for l in lines:
            out(l)

    def do_replay(self, start, upto=None):
        """Asks for the batches from start, as vLLM's example does; prints those
        after last (and before upto, the live one, when given)."""
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            if not self.replay.poll(10000):
                out("E replay: no answer within 10 s")
                return
            frames = self.replay.recv_multipart()
            if len(frames) != 3 or frames[0] != b"":
                out("E replay: %d frames, not [empty, seq, payload]" % len(frames))
                return
            _, seq_bytes, payload = frames
            if seq_bytes == END_SEQ and not payload:
                out("P end")
                return
            seq = int.from_bytes(seq_bytes, "big")
            if upto is None or self.last < seq < upto:
                self.batch("P", seq, payload)
                if upto is not None:
                    self.last = seq

    def live(self):
        frames = self.sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            out("E live: %d frames, not [topic, seq, payload]" % len(frames))
            return
        topic, seq_bytes, payload = frames
        if topic != self.a.topic.encode():
            out("E topic %r" % (topic,))
        seq = int.from_bytes(seq_bytes, "big")
        if self.last >= 0 and seq > self.last + 1 and self.replay is not None:
            self.do_replay(self.last + 1, seq)
        self.batch("B", seq, payload)
        self.last = seq

    def command(self, line):
        w = line.split()
        if not w:
            return True
        if w[0] == "quit":
            return False
        if w[0] == "pause":
            self.sub.close()
            self.sub = None
            out("paused")
        elif w[0] == "resume":
            self.open()
            out("resumed")
        elif w[0] == "replay":
            self.do_replay(int(w[1]))
        else:
            out("E unknown command %r" % (line,))
        return True

    def run(self):
        out("ready")
        stdin, pending = sys.stdin.fileno(), b""
        while True:
            while b"\n" in pending:  # commands are read whole, one at a time
                line, pending = pending.split(b"\n", 1)
                if not self.command(line.decode()):
                    return
            poller = zmq.Poller()
            poller.register(stdin, zmq.POLLIN)
            if self.sub is not None and not self.a.slow:
                poller.register(self.sub, zmq.POLLIN)
            ready = dict(poller.poll())
            if self.sub is not None and ready.get(self.sub):
                self.live()
                continue
            if stdin in ready:
                data = os.read(stdin, 4096)
                if not data:
                    return
                pending += data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--replay")
    p.add_argument("--topic", default="")
    p.add_argument("--format", choices=["array", "map"], default="array")
    p.add_argument("--vllm-seed")
    p.add_argument("--slow", action="store_true")
    Sub(p.parse_args()).run()


if __name__ == "__main__":
    main()
