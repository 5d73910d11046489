"""The README's demo table against the raw output it cites: bench/demo/report.py, run on the results folder
that "Where these come from" names, prints exactly the table's rows, so a figure changed by hand in the README
(or results committed without the table) fails here. Run: python3 -m unittest discover -s bench -p 'test_*.py'"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPORT = os.path.join(HERE, "demo", "report.py")


def readme_demo_section():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("### The bundled example")
    return text[start:text.index("\n## ", start)]


def report(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)


class DemoTable(unittest.TestCase):
    def setUp(self):
        cited = re.findall(r"`(bench/results/demo-[^`/]+)/?`", readme_demo_section())
        self.assertEqual(len(set(cited)), 1, f"the demo section should cite one results folder, not {cited}")
        self.results = os.path.join(ROOT, cited[0])

    def test_the_readme_table_is_what_the_results_give(self):
        printed = report("table", self.results)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        rows = [line for line in printed.stdout.splitlines() if line.startswith("| Needle ")]
        readme = [line for line in readme_demo_section().splitlines() if line.startswith("| Needle ")]
        self.assertEqual(len(rows), 6)
        self.assertEqual(readme, rows)

    def test_a_missing_output_is_an_error_naming_it(self):
        with tempfile.TemporaryDirectory() as work:
            copy = os.path.join(work, "results")
            shutil.copytree(self.results, copy)
            os.remove(os.path.join(copy, "n3-suite-cact.json"))
            printed = report("table", copy)
            self.assertNotEqual(printed.returncode, 0)
            self.assertIn("n3-suite-cact.json", printed.stderr)
            self.assertIn("run bench/demo_table.sh again", printed.stderr)


def confidence_section():
    with open(os.path.join(ROOT, "docs", "confidence.md")) as f:
        text = f.read()
    start = text.index("## The held-out figures")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


class ConfidenceFigures(unittest.TestCase):
    """docs/confidence.md's held-out figures against the results folder it cites."""

    def setUp(self):
        cited = re.findall(r"`(bench/results/demo-[^`/]+)/?`", confidence_section())
        self.assertEqual(len(set(cited)), 1, f"the figures should cite one results folder, not {cited}")
        self.results = os.path.join(ROOT, cited[0])

    def test_the_figures_are_what_the_results_give(self):
        printed = report("confidence", self.results)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        rows = [line for line in printed.stdout.splitlines() if line.startswith("| Needle ")]
        cited = [line for line in confidence_section().splitlines() if line.startswith("| Needle ")]
        self.assertEqual(len(rows) % 4, 0)
        self.assertEqual(cited, rows)

    def test_a_run_without_confidence_is_an_error_saying_so(self):
        with tempfile.TemporaryDirectory() as work:
            copy = os.path.join(work, "results")
            shutil.copytree(self.results, copy)
            for name in os.listdir(copy):
                if name.endswith("-eval-tuned-decode.json"):
                    os.remove(os.path.join(copy, name))
            printed = report("confidence", copy)
            self.assertNotEqual(printed.returncode, 0)
            self.assertIn("bench/demo_table.sh --confidence", printed.stderr)


if __name__ == "__main__":
    unittest.main()
