"""bench/gpu_check.sh's verdicts on made-up outputs, so that a check that cannot run here (there is no GPU) is
known to fail when it should: a gradient missing, misshapen or extra, a loss list cut short, a device slower
than the CPU or silent about its memory. Run: python3 -m unittest discover -s bench -p 'test_*.py'"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import gpu_verdicts

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "tests", "fixtures", "golden", "tiny_f32", "lora.safetensors")


def write_safetensors(path, tensors):
    """A safetensors file of F32 tensors, {name: (shape, values)}."""
    header, data = {}, b""
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + data)


class Gradients(unittest.TestCase):
    def setUp(self):
        self.golden = gpu_verdicts.read_safetensors(GOLDEN)
        self.grads = sorted(n for n in self.golden if "/grad_" in n)

    def copy(self, scale=1.0):
        """A device output equal to the golden (its gradients scaled)."""
        return {n: (shape, [v * scale if "/grad_" in n else v for v in values])
                for n, (shape, values) in self.golden.items() if n == "loss" or "/grad_" in n}

    def verdict(self, device, cpu=None):
        return gpu_verdicts.gradients(device, cpu or self.copy(), self.golden, 1e-4, 1e-3)

    def test_the_golden_itself_agrees(self):
        self.assertEqual(len(self.grads), 10)
        ok, line = self.verdict(self.copy())
        self.assertTrue(ok, line)
        self.assertTrue(line.startswith("agree (10 gradients"), line)

    def test_a_missing_gradient_fails(self):
        device = self.copy()
        del device[self.grads[3]]
        ok, line = self.verdict(device)
        self.assertFalse(ok)
        self.assertIn(f"device lacks {self.grads[3]}", line)

    def test_no_gradient_at_all_fails(self):
        ok, line = self.verdict({"loss": self.golden["loss"]})
        self.assertFalse(ok)
        self.assertEqual(line.count("device lacks"), 10, line)

    def test_a_gradient_missing_on_the_cpu_fails(self):
        cpu = self.copy()
        del cpu[self.grads[0]]
        ok, line = self.verdict(self.copy(), cpu)
        self.assertFalse(ok)
        self.assertIn(f"cpu lacks {self.grads[0]}", line)

    def test_a_short_gradient_fails_even_where_its_values_match(self):
        device = self.copy()
        shape, values = device[self.grads[1]]
        device[self.grads[1]] = (shape, values[: len(values) // 2])
        ok, line = self.verdict(device)
        self.assertFalse(ok)
        self.assertIn(f"device {self.grads[1]}: shape", line)

    def test_a_gradient_the_golden_lacks_fails(self):
        device = self.copy()
        device["stack/made/up/grad_A"] = ([1], [0.0])
        ok, line = self.verdict(device)
        self.assertFalse(ok)
        self.assertIn("device has stack/made/up/grad_A, which the golden has not", line)

    def test_no_loss_fails(self):
        device = self.copy()
        del device["loss"]
        ok, line = self.verdict(device)
        self.assertFalse(ok)
        self.assertIn("device wrote no loss", line)

    def test_gradients_off_by_more_than_the_tolerance_fail(self):
        ok, line = self.verdict(self.copy(scale=1.01))
        self.assertFalse(ok, line)
        self.assertTrue(line.startswith("DIFFER (10 gradients; vs cpu: loss 0.0e+00, gradients 1.0e-02"), line)

    def test_the_command_line_reads_files_and_exits_non_zero(self):
        with tempfile.TemporaryDirectory() as scratch:
            device, cpu = os.path.join(scratch, "device.safetensors"), os.path.join(scratch, "cpu.safetensors")
            full = self.copy()
            write_safetensors(cpu, full)
            del full[self.grads[-1]]
            write_safetensors(device, full)
            run = subprocess.run([sys.executable, os.path.join(HERE, "gpu_verdicts.py"), "gradients", device, cpu,
                                  GOLDEN, "1e-4", "1e-3"], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1, run.stdout)
            self.assertIn(f"device lacks {self.grads[-1]}", run.stdout)
            run = subprocess.run([sys.executable, os.path.join(HERE, "gpu_verdicts.py"), "gradients", cpu, cpu,
                                  GOLDEN, "1e-4", "1e-3"], capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stdout)
            run = subprocess.run([sys.executable, os.path.join(HERE, "gpu_verdicts.py"), "gradients",
                                  os.path.join(scratch, "never-written"), cpu, GOLDEN, "1e-4", "1e-3"],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 1, run.stdout)


class Losses(unittest.TestCase):
    def test_equal_lists_agree(self):
        self.assertTrue(gpu_verdicts.losses([1.0, 0.5], [1.0002, 0.5])[0])

    def test_a_shorter_list_or_none_fails(self):
        self.assertFalse(gpu_verdicts.losses([1.0], [1.0, 0.5])[0])
        self.assertFalse(gpu_verdicts.losses([], [])[0])

    def test_a_loss_off_by_more_than_1e_3_fails(self):
        self.assertFalse(gpu_verdicts.losses([1.0, 0.5], [1.0, 0.51])[0])


class Bench(unittest.TestCase):
    CPU_STEP = {"step_s": 1.11, "peak_rss_mb": 1130.0, "device_memory_mb": None, "backend": "cpu"}

    def test_a_faster_device_that_states_its_memory_passes(self):
        device = {"step_s": 0.4, "peak_rss_mb": 900.0, "device_memory_mb": 2048.0, "backend": "cuda"}
        ok, line = gpu_verdicts.bench(device, self.CPU_STEP)
        self.assertTrue(ok, line)
        self.assertIn("GPU memory 2048.0 MB", line)

    def test_a_slower_device_fails(self):
        device = {"step_s": 1.5, "peak_rss_mb": 900.0, "device_memory_mb": 2048.0, "backend": "cuda"}
        ok, line = gpu_verdicts.bench(device, self.CPU_STEP)
        self.assertFalse(ok)
        self.assertIn("a step is slower on the device than on the CPU", line)

    def test_a_device_silent_about_its_memory_fails(self):
        device = {"step_s": 0.4, "peak_rss_mb": 900.0, "device_memory_mb": None, "backend": "cuda"}
        ok, line = gpu_verdicts.bench(device, self.CPU_STEP)
        self.assertFalse(ok)
        self.assertIn("the device's memory is not stated", line)

    def test_a_report_without_its_time_fails(self):
        ok, _ = gpu_verdicts.bench({"backend": "cuda", "device_memory_mb": 1.0}, self.CPU_STEP)
        self.assertFalse(ok)

    def test_decoding_is_judged_by_tokens_per_second(self):
        cpu = {"decode_tokens_per_s": 50.0, "prefill_s": 0.6, "peak_rss_mb": 450.0}
        self.assertFalse(gpu_verdicts.bench({"decode_tokens_per_s": 9.0, "peak_rss_mb": 800.0}, cpu)[0])
        self.assertTrue(gpu_verdicts.bench({"decode_tokens_per_s": 80.0, "peak_rss_mb": 800.0}, cpu)[0])

    def test_a_decoding_report_is_judged_by_its_one_precision(self):
        def report(speed):
            return {"backend": "cpu", "precisions": [{"precision": "f32", "decode_tokens_per_s": speed}]}

        self.assertFalse(gpu_verdicts.bench(report(9.0), report(50.0))[0])
        self.assertTrue(gpu_verdicts.bench(report(80.0), report(50.0))[0])


if __name__ == "__main__":
    unittest.main()
