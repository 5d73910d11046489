"""The README's Benchmarks tables against the raw output they cite: bench/speed_report.py, run on the
bench/results folder the section names, prints exactly the tables the section holds; and the report
refuses a record with a run missing or failed, naming it. Run: python3 -m unittest discover -s bench -p 'test_*.py'"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPORT = os.path.join(HERE, "speed_report.py")


def readme_benchmarks_section():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("\n## Benchmarks")
    return text[start:text.index("\n## ", start + 1)]


def report(results):
    return subprocess.run([sys.executable, REPORT, results], capture_output=True, text=True)


class SpeedTables(unittest.TestCase):
    def setUp(self):
        cited = re.findall(r"`(bench/results/\d{4}-\d\d-\d\d-[^`/]+)/?`", readme_benchmarks_section())
        self.assertEqual(len(set(cited)), 1, f"the Benchmarks section should cite one results folder, not {cited}")
        self.results = os.path.join(ROOT, cited[0])

    def test_the_readme_tables_are_what_the_results_give(self):
        printed = report(self.results)
        self.assertEqual(printed.returncode, 0, printed.stderr)
        section = readme_benchmarks_section()
        for table in printed.stdout.strip().split("\n\n"):
            self.assertIn(table, section)

    def test_a_failed_run_is_an_error_naming_it(self):
        with tempfile.TemporaryDirectory() as work:
            copy = os.path.join(work, "results")
            shutil.copytree(self.results, copy)
            with open(os.path.join(copy, "runs.jsonl")) as f:
                runs = [json.loads(line) for line in f]
            for run in runs:
                if run["run"] == "step-needle3-reference":
                    run["exit"] = 1
            with open(os.path.join(copy, "runs.jsonl"), "w") as f:
                f.writelines(json.dumps(run) + "\n" for run in runs)
            printed = report(copy)
            self.assertNotEqual(printed.returncode, 0)
            self.assertIn("step-needle3-reference exited 1", printed.stderr)
            self.assertIn("run bench/record.sh again", printed.stderr)


if __name__ == "__main__":
    unittest.main()
