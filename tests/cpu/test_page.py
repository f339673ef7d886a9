"""The report as one page (harness/page.py): what index.html says, read as text; no browser."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import page_report
import pytest

from harness.night import page
from recipes.tiers import REHEARSAL_MARK, REHEARSAL_SETTINGS_ENV


class Elements(HTMLParser):
    """Every start tag's attributes, by tag (the page's structure without a browser)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: dict[str, list[dict]] = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.setdefault(tag, []).append(dict(attrs))


def claim_rows(text: str) -> dict[str, str]:
    """Each claim row's name -> its verdict cell."""
    rows = re.findall(r'data-claim="([^"]+)">.*?<td class="verdict">([^<]*)</td>', text, re.DOTALL)
    return dict(rows)


def figures(text: str) -> list[str]:
    return re.findall(r"<figure>.*?</figure>", text, re.DOTALL)


@pytest.fixture
def main_job(tmp_path):
    built = page_report.main_job(tmp_path, failing_reference=True)
    return built, page.write(built.report_dir).read_text()


def test_every_claim_has_its_row_verdict_and_colour(main_job):
    built, text = main_job
    assert claim_rows(text) == built.claims
    states = re.findall(r'<tr class="claim (\w+)" data-claim="([^"]+)"', text)
    assert sorted(name for state, name in states if state == "fail") == sorted(built.failing)
    assert ("pass", "native_qwen3.cpu.step1_loss_hf") in states


def test_each_row_names_its_published_value_tolerance_basis_lane_and_judge(main_job):
    _, text = main_job
    row = re.search(
        r'data-claim="native_qwen3.cpu.step1_loss_random_4b_width">(.*?)</tr>', text, re.DOTALL
    )[1]
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
    ]
    assert cells[2:7] == ["proxy", "12.43", "–", "12.9", "0.21"]
    assert cells[7] == "regression" and cells[8] == page.MAIN_JOB_JUDGE
    assert "cpu PROXY of the tutorial" in cells[9]


def test_text_from_the_report_is_escaped(main_job):
    _, text = main_job
    assert "fixture checkpoint &lt;seed 0&gt; &amp; 2 ranks" in text


def test_a_moved_claim_shows_its_diagnosis_first_divergence_and_upstream_report(main_job):
    built, text = main_job
    moved = text[text.index('id="moved"') : text.index('id="curves"')]
    assert "rope_theta (theta 5x off; effect +0.35)" in moved
    assert "first diverging module: layers.0.attention" in moved
    (reference,) = re.findall(
        r"<h3><code>native_qwen3-cpu-hf.reference</code></h3>(.*?)</ul>", moved, re.DOTALL
    )
    assert "rope_theta (theta 5x off" in reference  # the run's own diagnosis, under its own row
    link = "upstream/native_qwen3.cpu.step1_loss_random_4b_width.md"
    assert f'href="{link}"' in moved and (built.report_dir / link).is_file()


def test_images_are_inline_and_nothing_is_fetched(main_job):
    _, text = main_job
    tags = Elements(text).tags
    assert len(tags["img"]) == 1  # the one recipe and tier's loss curve
    assert all(img["src"].startswith("data:image/png;base64,") for img in tags["img"])
    assert "script" not in tags and "link" not in tags
    assert not re.search(r"(src|href)=\"(https?:)?//", text)


def test_speed_and_rank_logs(main_job):
    built, text = main_job
    speed = text[text.index('id="launches"') : text.index('id="trends"')]
    assert "native_qwen3-cpu-hf" in speed and "0.130" in speed and "31,508" in speed
    hrefs = [a["href"] for a in Elements(text).tags["a"] if not a["href"].startswith("upstream/")]
    logs = [h for h in hrefs if h.endswith(".log")]
    assert len(logs) == 2 * (2 * 2 + 1)  # 2 runs x (2 ranks x stdout, stderr + console)
    assert all((built.report_dir / h).exists() for h in hrefs)


def test_inputs_and_versions(main_job):
    _, text = main_job
    assert page_report.TOKENIZER_SHA in text
    assert "<th>torchtitan</th><td>0.3.0</td>" in text


def test_a_main_job_page_has_no_rehearsal_mark(main_job):
    _, text = main_job
    assert "REHEARSAL" not in text and REHEARSAL_MARK not in text


def test_a_night_sets_the_plan_beside_the_measured_launch(tmp_path):
    built = page_report.night(tmp_path, rehearsal=False)
    text = page.write(built.report_dir, built.runs_log).read_text()
    assert claim_rows(text) == built.claims
    row = re.search(r"<code>config2-as_published</code></td>(.*?)</tr>", text, re.DOTALL)[1]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[0] == "trn2" and cells[-2:] == ["31.2", "20"]
    assert re.search(r"<code>config1-corrected</code></td>.*?not launched", text, re.DOTALL)
    assert "2026-12-07: torch 2.13.0→2.14.0" in text
    assert len(figures(text)) == len(page_report.trend_files(built.report_dir)) > 0
    assert "test_published.py::test_step1_loss[config2-random]" in text
    moved = text[text.index('id="moved"') : text.index('id="curves"')]
    assert "as published vs published: not reproduced" in moved


def test_a_rehearsal_says_so_on_every_figure(tmp_path, monkeypatch):
    # What every step of a rehearsal sees (recipes.tiers.rehearsal_mark reads only that it is set).
    monkeypatch.setenv(REHEARSAL_SETTINGS_ENV, str(tmp_path / "settings.json"))
    built = page_report.night(tmp_path, rehearsal=True)
    text = page.write(built.report_dir, built.runs_log).read_text()
    shown = figures(text)
    assert shown and all(f"REHEARSAL: {REHEARSAL_MARK}" in f for f in shown)
    for section in re.split(r"<h2 ", text)[1:]:
        assert f"REHEARSAL: {REHEARSAL_MARK}" in section, section[:80]
    assert 'id="rehearsal-banner"' in text and "(rehearsal)" in text


def test_a_rehearsal_report_is_marked_from_its_own_results(tmp_path):
    """Written later, outside the rehearsal: tests.json's mark alone marks the page."""
    built = page_report.night(tmp_path, rehearsal=True)
    text = page.write(built.report_dir).read_text()
    assert 'id="rehearsal-banner"' in text and "no trend" in text


def test_the_command(tmp_path, capsys):
    built = page_report.main_job(tmp_path)
    assert page.main([str(built.report_dir)]) == 0
    assert f"page: {built.report_dir / page.PAGE_FILE}" in capsys.readouterr().out
    assert page.main([str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_an_empty_report_dir_still_gets_a_page(tmp_path):
    text = page.write(tmp_path).read_text()
    assert "No claim was judged" in text and "No run directory" in text
