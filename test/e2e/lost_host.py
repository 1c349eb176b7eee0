#!/usr/bin/env python3
"""A host lost for good ends the job in bounded time (bench/cluster/slow_link.sh: 2 hosts x 2 ranks).

zero-gpt trains the tiny GPT with ZERO_TIMEOUT_S=20 on hosts whose net.ipv4.tcp_retries2 is 5
(the node setting docs/multi-node.md gives for launches with mpirun). Once it has logged a few
steps, host 1's link goes down for good. The launch must then end within ZERO_TIMEOUT_S + 60 s
with a non-zero status, host 0's ranks must report the deadline naming node 1's host and pointing
at the host and the network, and no process may be left running in either host's namespace
(slow_link.sh names any it finds after mpiexec has ended). Exits 77 (skipped) where slow_link.sh
cannot make namespaces.

With FLAP_S, the link comes back after FLAP_S seconds (an outage shorter than the deadline, which
TCP's backoff can still stretch past it): the job may end or ride it out, but every deadline report
must blame only the other host's ranks, naming their node and host, and none may call the
partition "different collectives".

    lost_host.py SLOW_LINK ZERO_GPT CONFIG WORKDIR [FLAP_S]
"""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

slow_link, exe, config, work = sys.argv[1:5]
FLAP_S = float(sys.argv[5]) if len(sys.argv) > 5 else 0  # experiment: link back up after this long
TIMEOUT_S = 20
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def fail(msg):
    sys.exit("lost_host: FAIL: " + msg)


cmd = ["bash", slow_link, "--hosts", "2", "--ranks-per-host", "2", "--tcp-retries2", "5", "--",
       exe, "--config", config, "--set", "run.steps=100000", "--set", "steps_per_print=1",
       "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
       "--set", "model.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2",
       "--set", "run.eval_interval=0", "--set", "run.sample_tokens=0", "--set", "run.save_interval=0",
       "--set", f"run.out_dir={work}/run"]
env = dict(os.environ, ZERO_TIMEOUT_S=str(TIMEOUT_S))
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
err_lines = []
reader = threading.Thread(target=lambda: err_lines.extend(p.stderr), daemon=True)
reader.start()

# Wait for training (a few logged steps), at most 3 minutes.
out_lines = []
start = time.monotonic()
for line in p.stdout:
    out_lines.append(line)
    if re.match(r"step +3/", line):
        break
    if time.monotonic() - start > 180:
        break
if not any(l.startswith("step") for l in out_lines):
    p.wait(timeout=60)
    reader.join(timeout=5)
    if p.returncode == 77:
        print("".join(err_lines), file=sys.stderr)
        sys.exit(77)
    fail(f"the job never trained (status {p.returncode}):\n{''.join(out_lines)}{''.join(err_lines)}")

host1 = f"slowlink-{p.pid}-h1"
cut = subprocess.run(["ip", "-n", host1, "link", "set", "slow0", "down"], capture_output=True, text=True)
if cut.returncode != 0:
    p.kill()
    fail(f"cannot cut {host1}'s link: {cut.stderr}")
cut_at = time.monotonic()
if FLAP_S > 0:
    time.sleep(FLAP_S)
    subprocess.run(["ip", "-n", host1, "link", "set", "slow0", "up"], check=True)
rest = threading.Thread(target=lambda: out_lines.extend(p.stdout), daemon=True)
rest.start()
try:
    p.wait(timeout=TIMEOUT_S + 60 + 60)
except subprocess.TimeoutExpired:
    p.kill()
    p.wait()
took = time.monotonic() - cut_at
reader.join(timeout=10)
rest.join(timeout=10)
err = "".join(err_lines)
print(f"lost_host: host 1 cut after {len([l for l in out_lines if l.startswith('step')])} logged steps; the "
      f"launch ended {took:.1f} s later with status {p.returncode} (ZERO_TIMEOUT_S={TIMEOUT_S})")
if FLAP_S > 0:
    # A partition, not a program error: every report blames only the ranks of the other host (ranks
    # 0, 1 on slowlink-h0, ranks 2, 3 on slowlink-h1), by host, and none calls it different collectives.
    reports = [l for l in err_lines if "did not complete within the collective deadline" in l]
    print(f"lost_host: a {FLAP_S:.0f} s flap: the launch ended {took:.1f} s after the cut with status "
          f"{p.returncode}, {len(reports)} deadline report(s)")
    if p.returncode != 0 and not reports:
        fail(f"the launch failed without a deadline report:\n{err[-3000:]}")
    # A report blames the ranks that did not arrive: those must be the other host's, named with
    # their node and host. Ranks that answered are named too, as still in an earlier collective
    # (the other host's, once the link is back; or one of its own, waiting for data lost on the
    # cut link) or already in a later one: no blame, but the other host must be named somewhere.
    # When every rank answered from the same collective, all are named by node and host, and the
    # advice is the network's.
    for line in reports:
        me = int(re.match(r"\[rank (\d)/4\]", line).group(1))
        other = (str(1 - me // 2), f"slowlink-h{1 - me // 2}")
        missing = [m for c in line.split("; ") if "did not arrive" in c
                   for m in re.findall(r"\(node (\d), host ([^)\s]+)\)", c)]
        named = re.findall(r"\(node (\d), host ([^)\s]+)\)", line)
        if other not in named:
            fail(f"rank {me}'s report does not name the other host's ranks by node and host:\n{line}")
        if any(m != other for m in missing):
            fail(f"rank {me} blames its own host or the wrong one:\n{line}")
        if "different collectives" in line:
            fail(f"a network partition was reported as different collectives:\n{line}")
        # Every rank in the collective (the link is back, its data still late): the network.
        if "every rank answered" in line and "waiting in it: ranks 0, 1 (node 0" in line and \
                "check the network between the nodes first" not in line:
            fail(f"rank {me}'s report finds every rank in the collective but does not point at the network:\n{line}")
    sys.exit(0)
if took > TIMEOUT_S + 60:
    fail(f"the launch took {took:.1f} s to end after the cut, more than ZERO_TIMEOUT_S + 60 s:\n{err[-3000:]}")
if p.returncode == 0:
    fail(f"the launch ended with status 0 after losing a host:\n{err[-3000:]}")
if "did not complete within the collective deadline" not in err or "slowlink-h1" not in err:
    fail(f"no deadline report naming host slowlink-h1:\n{err[-3000:]}")
if "check that host and the network" not in err:
    fail(f"the report does not point at the lost host and the network:\n{err[-3000:]}")
if "slow_link: left running:" in err:
    fail("processes were left running after the launch ended: " +
         next(l for l in err_lines if "left running" in l))
