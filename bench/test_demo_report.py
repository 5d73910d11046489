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


if __name__ == "__main__":
    unittest.main()
