"""`python -m vmmipc demo`: first the driver's refusal of legacy CUDA IPC on VMM memory
without vmmipc, then two processes sharing that memory through legacy CUDA IPC with
libvmmipc.so preloaded, on the GPU when there is one, else on vmmipc's simulated driver
(host memory stands in for device memory). The pair runs twice, to show that the
importer's address is the same in fresh processes. What scripts/demo.sh shows from a
source tree, from an installed wheel instead: its peer program and simulated driver come
from the package (vmmipc/_sim, paths.simulator()).

The simulated driver is only ever loaded here, by this command's own children, through
their LD_LIBRARY_PATH: nothing else puts its folder on a search path, so no other program
finds it instead of the real driver.
"""

import os
import subprocess
import sys

from vmmipc import paths, settled

CHUNK = 2 << 20


class DemoError(Exception):
    pass


class Peer:
    """One vmmipc_peer process: a command per line on stdin, "ok ..." or "err ..." back."""

    def __init__(self, peer, env):
        self.env = env
        self.process = subprocess.Popen([peer], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True, bufsize=1)

    def answer(self, command):
        """The peer's answer to `command` as it is: "ok ..." or "err <CUresult> <name>"."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().rstrip("\n")

    def ask(self, command):
        answer = self.answer(command)
        if not answer.startswith("ok"):
            raise DemoError(f"'{command}' failed: {answer or 'no answer (the peer exited)'}")
        return answer[2:].strip()

    def stop(self):
        try:
            self.process.stdin.write("exit\n")
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


def _on_gpu(peer):
    """Whether the peer initialises the system's driver (a GPU is there)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        return subprocess.run([peer, "probe"], env=env, capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _size_text(size):
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"0x{size:x}"


def _placement(env, library):
    """How the importer's address is made, with the zone that vmmipc-config says the
    library settles in the importer's environment (its base and slot size); the rule
    without numbers when the tool cannot be asked."""
    try:
        zone = settled.settle(env, library=library).layout["zone"]
    except settled.ToolError:
        return "import zone base + slot 0 x slot size + (address - region base)"
    return (f"import zone 0x{zone['base']:x} + slot 0 x {_size_text(zone['slot_size'])} + "
            f"(address - region base)")


def refusal_without_vmmipc(peer, env):
    """What the driver itself answers, without vmmipc, to cuIpcGetMemHandle on VMM memory
    (the simulated driver answers as the real one: CUDA_ERROR_INVALID_VALUE)."""
    bare = Peer(peer, env)
    try:
        bare.ask("init")
        pid = bare.ask("pid")
        base = bare.ask(f"alloc_vmm buf {CHUNK} 2")
        answer = bare.answer(f"get {base}")
    finally:
        bare.stop()
    said = answer.split()
    if said[:1] == ["err"] and len(said) == 3:
        result = f"{said[2]} ({said[1]}): the driver refuses VMM memory for legacy IPC"
    else:
        result = f"'{answer}' (this driver did not refuse it)"
    return (f"without vmmipc (pid {pid}, no LD_PRELOAD): cuMemCreate + cuMemMap at {base}, "
            f"cuIpcGetMemHandle -> {result}")


def run_demo(library, peer, sim_dir, simulated=None, out=sys.stdout):
    """The demo; returns 0, or raises DemoError. simulated: True forces the simulated
    driver, False the system's, None picks (the GPU when the peer can initialise it)."""
    if simulated is None:
        simulated = not _on_gpu(peer)
    base_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if simulated:
        where = ("the simulated CUDA driver (no GPU here; host memory stands in for device "
                 "memory)")
        base_env["LD_LIBRARY_PATH"] = sim_dir
    else:
        where = "the GPU (real CUDA driver)"
    base_env["VMMIPC_LOG_LEVEL"] = os.environ.get("VMMIPC_LOG_LEVEL", "warn")
    base_env["LD_PRELOAD"] = library
    print(f"vmmipc demo on {where}", file=out)
    print(f"library: {library}", file=out)
    print(file=out)
    print(refusal_without_vmmipc(peer, dict(base_env, LD_PRELOAD="")), file=out)
    first = None
    for run in (1, 2):
        exporter = Peer(peer, dict(base_env, VMMIPC_RANK="0"))
        importer = None
        try:
            exporter.ask("init")
            exporter_pid = exporter.ask("pid")
            base = exporter.ask(f"alloc_vmm buf {CHUNK} 2")
            exporter.ask(f"fill {base} {2 * CHUNK} 7")
            handle = exporter.ask(f"get {base}")
            importer = Peer(peer, dict(base_env, VMMIPC_RANK="1"))
            importer.ask("init")
            importer_pid = importer.ask("pid")
            ptr = importer.ask(f"open {handle}")
            importer.ask(f"check {ptr} {2 * CHUNK} 7")
            importer.ask(f"fill {ptr} {2 * CHUNK} 8")
            exporter.ask(f"check {base} {2 * CHUNK} 8")
            if run == 1:
                print(file=out)
                print(f"exporter (pid {exporter_pid}, VMMIPC_RANK=0): cuMemCreate + "
                      f"cuMemMap, 2 chunks of 2 MiB at {base}", file=out)
                print(f"cuIpcGetMemHandle({base}) -> 64-byte VMM2 handle:", file=out)
                print(f"  {handle}", file=out)
                print(f"  {importer.ask('decode ' + handle)}", file=out)
                print(f"importer (pid {importer_pid}, VMMIPC_RANK=1): cuIpcOpenMemHandle "
                      f"-> {ptr}", file=out)
                print(f"  = {_placement(importer.env, library)}", file=out)
                print("importer read the exporter's 4 MiB across the chunk boundary: ok",
                      file=out)
                print("importer wrote 4 MiB through its mapping; the exporter read them "
                      "back: ok", file=out)
                first = ptr
            else:
                print(file=out)
                print(f"second run, fresh processes: importer got {ptr}", file=out)
                if ptr != first:
                    raise DemoError(f"addresses differ between runs ({first} vs {ptr})")
                print("same address as the first run: pointers baked into CUDA graphs "
                      "stay valid", file=out)
            importer.ask(f"close {ptr}")
        finally:
            if importer is not None:
                importer.stop()
            exporter.stop()
    return 0


def main(simulated=None):
    """`python -m vmmipc demo`: the installed package's library, peer and simulator."""
    library, looked_at = paths.find_library(None)
    if library is None:
        print(f"python -m vmmipc demo: {paths.LIBRARY_NAME} not found (looked at: "
              f"{', '.join(looked_at)})", file=sys.stderr)
        return 1
    simulator = paths.simulator()
    if simulator is None:
        print("python -m vmmipc demo: this installation has no simulated driver and demo "
              "peer (the wheel ships them in vmmipc/_sim; from a source tree: "
              "scripts/demo.sh)", file=sys.stderr)
        return 1
    sim_dir, peer = simulator
    try:
        return run_demo(library, peer, sim_dir, simulated)
    except DemoError as error:
        print(f"python -m vmmipc demo: {error}", file=sys.stderr)
        return 1
