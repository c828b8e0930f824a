"""The metrics file of a resumed run holds each step once."""
import json

from pretrain.monitor import Monitor


def test_a_resumed_run_drops_the_interrupted_attempts_records_past_its_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 10.0 - s}) + "\n" for s in range(1, 11)) + '{"step": 11, "lo')
    monitor = Monitor(tmp_path, total_steps=20, start_step=6, progress=False)
    monitor.record({"step": 7, "loss": 0.5}, line=False)
    monitor.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert records[-1]["loss"] == 0.5 and records[5]["loss"] == 4.0


def test_a_fresh_run_and_a_clean_file_are_left_alone(tmp_path):
    Monitor(tmp_path, total_steps=5, start_step=0, progress=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    lines = "".join(json.dumps({"step": s}) + "\n" for s in range(1, 4))
    (tmp_path / "metrics.jsonl").write_text(lines)
    Monitor(tmp_path, total_steps=5, start_step=3, progress=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == lines
