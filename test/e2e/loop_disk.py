"""A small ext4 image, loop-mounted, for the storage-fault tests (gpt_run_dir_full.py,
gpt_latest_full.py, gpt_ckpt_space.py): made, filled to a chosen free space, and unmounted by the
caller's finally; and the checks those tests report through.

Without root or loop devices the test exits 77, which ctest reports as skipped, saying why.
"""
import os
import shutil
import subprocess
import sys


def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def fresh_mount(work, test, mib=8):
    """An empty `work` folder with the image mounted at work/mnt (see mount)."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return mount(work, test, mib)


def mount(work, test, mib=8):
    """An ext4 image of `mib` MiB (1 KiB blocks, no reserve, no journal) mounted at work/mnt."""
    def skip(why):
        print(f"{test}: SKIPPED: {why}")
        sys.exit(77)

    if os.geteuid() != 0:
        skip("needs root to mount a loop device")
    if shutil.which("mkfs.ext4") is None:
        skip("mkfs.ext4 is not installed")
    image, mnt = os.path.join(work, "disk.img"), os.path.join(work, "mnt")
    os.makedirs(mnt)
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    r = sh("mkfs.ext4", "-q", "-F", "-b", "1024", "-m", "0", "-N", "64", "-O", "^has_journal", image)
    if r.returncode != 0:
        skip(f"mkfs.ext4 failed: {r.stderr.strip()}")
    r = sh("mount", "-o", "loop", image, mnt)
    if r.returncode != 0:
        skip(f"cannot loop-mount an image here: {r.stderr.strip()}")
    return mnt


def unmount(mnt):
    sh("umount", mnt)


def fill(mnt, leave_kib=0):
    """Fills the filesystem with mnt/filler, then frees `leave_kib` KiB of it."""
    filler = os.path.join(mnt, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (65536, 1024):  # big writes, then the last blocks
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
        os.fsync(fd)
    finally:
        os.close(fd)
    if leave_kib:
        os.truncate(filler, max(0, os.path.getsize(filler) - leave_kib * 1024))
    os.sync()


def kib_used(path):
    """KiB of disk the files and directories under `path` take."""
    total = 0
    for d, dirs, files in os.walk(path):
        total += os.lstat(d).st_blocks
        total += sum(os.lstat(os.path.join(d, f)).st_blocks for f in files)
    return total // 2  # st_blocks counts 512-byte units


FAILURES = []


def expect(name, ok, out, parts=(), absent=()):
    """One check: `ok`, every text of `parts` in `out` and none of `absent`."""
    missing = [p for p in parts if p not in out]
    present = [p for p in absent if p in out]
    if not ok or missing or present:
        FAILURES.append(name)
        print(f"FAIL: {name}: missing {missing}, unwanted {present}:\n{out[-3000:]}")
    else:
        print(f"{name}: ok")


def must(result, what):
    """A run a test builds on: (status, output) that must have succeeded."""
    rc, out = result
    if rc != 0:
        sys.exit(f"{what} failed ({rc}):\n{out}")
    return out


def finish():
    if FAILURES:
        sys.exit(f"{len(FAILURES)} case(s) failed: {FAILURES}")
    print("all cases passed")
