from ctxkernel.testing import check_conformance


def test_basic_passes_the_conformance_suite(tmp_path):
    report = check_conformance(tmp_path, ["basic"], entry_points=False)
    assert report.compactions > 0  # the workload really needed management
    assert report.peak_prompt_tokens <= report.effective_window
    assert "effective window never exceeded" in report.checks
