#!/usr/bin/env python3
"""Tests of tests/python/nixl_client_check.py and its launcher tests/python/pidfd_seccomp.py
without a GPU: the check's skips (exit 77 with a SKIPPED: line and the SUMMARY line, with no
torch, no nixl and no wheel, no GPU), how it reads UCX's PROTO_INFO tables into a lane, which
step-zero setting it picks, and the seccomp filter (a child's pidfd_getfd answers EPERM, the
parent's is left alone).

  test_nixl_client_check.py [unittest args]

Standard library only. ctest: scripts.nixl_client_check (unit).
"""

import os
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.join(SOURCE_DIR, "tests", "python")
CHECK = os.path.join(HERE, "nixl_client_check.py")
LAUNCHER = os.path.join(HERE, "pidfd_seccomp.py")
sys.path.insert(0, HERE)
import nixl_client_check as ncc  # noqa: E402  (standard library at import time)
import pidfd_seccomp  # noqa: E402

# What UCX 1.23 (nixl-cu13 1.5.1) prints with UCX_PROTO_INFO=y, cut to two tables and a host one.
PROTO_INFO = """\
[1796283900.190106] [vm:756  :0]      ucp_worker.c:1997 UCX  INFO    initiator intra-node cfg#2 rma_am(tcp/lo)  device(cuda_ipc/cuda)  am(tcp/lo cuda_ipc/cuda)  ka(tcp/lo)
[1796283900.191478] [vm:756  :0]   +--------------------------------+---------------------------------------------------------------+
[1796283900.191478] [vm:756  :0]   | initiator intra-node cfg#2                                      |
[1796283900.191478] [vm:756  :0]   | remote memory write by ucp_put* from host memory to cuda/dev[1] |
[1796283900.191478] [vm:756  :0]   +--------------------------------+--------------------+-----------------------------------+
[1796283900.191478] [vm:756  :0]   |                         0..inf | software emulation | tcp/lo                            |
[1796283900.200875] [vm:756  :0]   | initiator intra-node cfg#2                               |
[1796283900.200875] [vm:756  :0]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
[1796283900.200875] [vm:756  :0]   +--------------------------------+--------------------+----------+
[1796283900.200875] [vm:756  :0]   |                         Range  |    Description     |  Config  |
[1796283900.200875] [vm:756  :0]   |                         0..inf | zero-copy          | cuda_ipc/cuda |
INFO initiator READ big: 1580.0 GB/s
[1796283905.519814] [vm:756  :0]   | initiator intra-node cfg#2                                    |
[1796283905.519814] [vm:756  :0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda |
[1796283905.519814] [vm:756  :0]   |                         0..inf | software emulation | tcp/lo  |
"""


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VMMIPC_", "UCX_", "NIXL_")) and k not in ("LD_PRELOAD",)}
    env.update(extra)
    return env


class SkipTest(unittest.TestCase):
    """Nothing can run here: exit 77, a SKIPPED: line, one SKIP check and the SUMMARY line."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def stub(self, name, text):
        path = os.path.join(self.tmp.name, "stubs", name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "__init__.py"), "w") as handle:
            handle.write(text)

    def run_check(self, *args):
        env = clean_env(PYTHONPATH=os.path.join(self.tmp.name, "stubs"))
        return subprocess.run([sys.executable, CHECK, "--out", os.path.join(self.tmp.name, "out"),
                               "--wheel", os.path.join(self.tmp.name, "no.whl")] + list(args),
                              env=env, capture_output=True, text=True, timeout=60, check=False)

    def assert_skipped(self, out, why):
        self.assertEqual(out.returncode, 77, out.stdout + out.stderr)
        self.assertIn("SKIPPED: " + why, out.stdout)
        self.assertIn("CHECK nixl_client SKIP " + why, out.stdout)
        self.assertIn("SUMMARY nixl_client_check: 0 PASS, 0 FAIL, 1 SKIP", out.stdout)

    def test_no_nixl_and_no_wheel(self):
        self.stub("torch", "")  # torch is there, nixl is not
        self.assert_skipped(self.run_check(), "nixl is not installed and no wheel was found")

    def test_no_gpu(self):
        self.stub("torch", "__version__ = '2.fake'\nclass version:\n    cuda = '13.0'\n"
                           "class cuda:\n    @staticmethod\n    def is_available():\n"
                           "        return False\n")
        self.stub("nixl_cu13", "")
        self.assert_skipped(self.run_check(), "no GPU visible to torch 2.fake")


class ReadingTest(unittest.TestCase):

    def test_the_lane_is_the_gpu_to_gpu_tables_largest_sizes(self):
        lanes, titles = ncc.lane_of(PROTO_INFO)
        self.assertEqual(lanes, {"read": ["zero-copy cuda_ipc/cuda"],
                                 "write": ["software emulation tcp/lo"]})
        self.assertEqual(titles, [
            "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]",
            "remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda"])

    def test_step_zero_picks_the_fastest_setting_with_every_byte_right(self):
        def rows(read, write, wrong=0):
            return [dict(op=op, tensor=t, gbps=bw, error="", wrong=wrong)
                    for op, bw in (("READ", read), ("WRITE", write)) for t in ("big", "multi")]
        self.assertEqual(ncc.pick({"defaults": rows(0.5, 1000), "get_on": rows(1500, 1000),
                                   "wrong": rows(2000, 2000, wrong=1)}), "get_on")
        self.assertIsNone(ncc.pick({"defaults": rows(0.5, 1000, wrong=3)}))

    def test_each_case_gets_its_environment(self):
        base = {"PATH": "/bin", "LD_PRELOAD": "/x.so", "UCX_TLS": "tcp", "VMMIPC_RANK": "4",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        ucx = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "on"}
        a = ncc.case_env(base, "a", ucx, "/lib.so", "/out")
        self.assertNotIn("LD_PRELOAD", a)
        self.assertNotIn("UCX_TLS", a)
        self.assertNotIn("VMMIPC_RANK", a)
        self.assertEqual(a["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"], "on")
        self.assertEqual(a["UCX_PROTO_INFO"], "y")
        self.assertEqual(a["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True")
        d = ncc.case_env(base, "d", ucx, "/lib.so", "/out")
        self.assertEqual((d["LD_PRELOAD"], d["VMMIPC_STATS"]), ("/lib.so", "1"))
        e = ncc.case_env(base, "e", {}, "/lib.so", "/out")
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", e)
        self.assertNotIn("LD_PRELOAD", e)


@unittest.skipUnless(pidfd_seccomp.probe() == "allowed",
                     "pidfd_getfd is not allowed here to begin with (%s)" % pidfd_seccomp.probe())
class SeccompTest(unittest.TestCase):

    def test_the_child_gets_eperm_and_the_parent_keeps_it(self):
        code = "import pidfd_seccomp; print(pidfd_seccomp.probe())"
        out = subprocess.run([sys.executable, LAUNCHER, "--probe", "--", sys.executable, "-c",
                              code], env=clean_env(PYTHONPATH=HERE), capture_output=True,
                             text=True, timeout=60, check=False)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        self.assertRegex(lines[0], r"before the filter: pidfd_getfd allowed$")
        self.assertRegex(lines[1], r"with the filter: pidfd_getfd EPERM$")
        self.assertEqual(lines[2], "EPERM")  # the command it ran, after exec
        self.assertEqual(pidfd_seccomp.probe(), "allowed")

    def test_without_a_command_it_says_how(self):
        out = subprocess.run([sys.executable, LAUNCHER], capture_output=True, text=True,
                             timeout=60, check=False)
        self.assertEqual(out.returncode, 2)
        self.assertIn("pidfd_seccomp.py [--probe] -- CMD", out.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
