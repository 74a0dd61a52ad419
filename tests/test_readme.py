"""README.md stays true: its quickstart code runs as written, and its claims point at things that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def first_python_block(heading: str) -> str:
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_torch_quickstart_runs(capsys):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(first_python_block("Quickstart: PyTorch"), "README-torch", "exec"), namespace)  # noqa: S102 - the README's code
    # Seeded, the three steps are all finite: the scale stays at its default and nothing is skipped.
    assert capsys.readouterr().out.split() == ["32768.0", "False", "0"]
    opt, model = namespace["opt"], namespace["model"]
    # Every step reached the inner optimizer (a skipped step would not count) and moved every parameter.
    assert [int(opt.inner_optimizer.state[p]["step"]) for p in model.parameters()] == [3] * 4
    for p in model.parameters():
        assert torch.isfinite(p).all() and opt.inner_optimizer.state[p]["exp_avg"].abs().sum() > 0


def test_jax_quickstart_runs(capsys):
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    import jax.numpy as jnp

    namespace: dict = {}
    exec(compile(first_python_block("Quickstart: JAX / optax"), "README-jax", "exec"), namespace)  # noqa: S102 - the README's code
    assert capsys.readouterr().out.split() == ["32768.0", "0"]
    # The step was applied: adamw moved every parameter from its start (w = ones, b = zeros) by about lr.
    params = namespace["params"]
    assert bool(jnp.all(jnp.abs(params["w"] - 1.0) > 1e-4)) and bool(jnp.all(jnp.abs(params["b"]) > 1e-4))
    assert all(bool(jnp.isfinite(v).all()) for v in params.values())


def test_the_two_setup_commands_are_the_makefile_targets_ci_runs():
    root = Path(__file__).resolve().parents[1]
    assert "make demo" in README and "make test" in README
    makefile = (root / "Makefile").read_text()
    for target in ("demo", "test", "test-core", "test-keras", "lint"):
        assert f"\n{target}:" in makefile, target
    # make demo installs the demo extra only; the numpy-only pass installs nothing but the core and pytest.
    assert "-e '.[demo]'" in makefile and "-e . pytest" in makefile
    ci = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()]
    assert {"make test", "make test-core", "make lint"} <= set(ci)
    # ... and the release checks the README names: the site (strict), the site in a browser, the wheel, the types.
    for target in ("docs", "docs-check", "wheel-check", "typecheck"):
        assert f"`make {target}`" in README and f"\n{target}:" in makefile and f"make {target}" in ci, target
    assert "mkdocs build --strict" in makefile


def test_readme_is_a_landing_page():
    # About 200 lines at most: the detail lives in docs/ (the site), which the README links into.
    assert len(README.splitlines()) <= 200
    for heading in ("Quickstart: PyTorch", "Quickstart: JAX / optax", "Quickstart: Keras 3", "Use it where you train"):
        assert f"\n## {heading}\n" in README, heading
    links = set(re.findall(r"\]\((docs/[^)#]+)", README))
    for page in ("docs/concepts.md", "docs/benchmarks.md", "docs/how-to/trainers.md", "docs/migration/gradscaler.md",
                 "docs/getting-started/torch.md", "docs/demo.md"):
        assert page in links, page
    assert "](docs/demo.png)" in README and "](CHANGELOG.md)" in README


def test_linked_docs_exist():
    root = Path(__file__).resolve().parents[1]
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        path, _, anchor = link.partition("#")
        assert (root / path).exists(), link
        if anchor:  # GitHub's anchor of a heading: lower case, spaces as hyphens
            headings = re.findall(r"^#+ (.+)$", (root / path).read_text(encoding="utf-8"), flags=re.MULTILINE)
            assert anchor in {h.strip().lower().replace(" ", "-") for h in headings}, link


def test_use_it_where_you_train_runs(capsys):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(first_python_block("Use it where you train"), "README-gradscaler", "exec"), namespace)  # noqa: S102
    # Seeded: torch's default 2**16 overflows float16 in the first backward; that step is skipped (the fused AdamW
    # never steps: 2 steps counted), the scale backs off once, and the next two steps are finite.
    assert capsys.readouterr().out.split() == ["32768.0", "False", "1"]
    opt, model = namespace["opt"], namespace["model"]
    assert [int(opt.state[p]["step"]) for p in model.parameters()] == [2, 2]


@pytest.mark.parametrize(
    "page, heading",
    [("getting-started/torch.md", "Quickstart: PyTorch"), ("getting-started/jax.md", "Quickstart: JAX / optax"),
     ("getting-started/keras.md", "Quickstart: Keras 3"), ("how-to/trainers.md", "Use it where you train")],
)
def test_the_site_shows_the_readme_quickstarts(page, heading):
    # The pages' first example is the README's, which the tests above run; lines fit the site's code column.
    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text(encoding="utf-8")
    shown = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    assert shown == first_python_block(heading)
    assert max(len(line) for line in shown.splitlines()) <= 100


def test_install_is_from_a_checkout_until_the_package_is_on_an_index():
    install = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", install, re.DOTALL).group(1)
    assert "pip install '.[torch]'" in commands and "pip install .  " in commands and "make wheel" in commands
    assert "not on a package index yet" in install
    # the bare index install is mentioned only as what comes later, not as a command to run now
    assert "pip install lossscale" not in commands and "pip install 'lossscale[" not in commands
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\nwheel:" in makefile and "pip wheel --no-deps --wheel-dir dist ." in makefile


def test_the_setup_commands_say_how_long_they_take_and_name_the_fast_target():
    section = README.split("\n## Two commands", 1)[1].split("\n## ", 1)[0]
    assert "2-core machine" in section
    assert re.search(r"`make demo`: \d+ to \d+ minutes", section)
    assert re.search(r"`make test`: \d+ minutes to an hour", section)
    assert "`make test-fast`" in section
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "\ntest-fast:" in makefile and '-m "not slow"' in makefile


def test_the_demo_table_gives_the_range_over_the_seeds_of_docs_demo():
    # The README's table is the range, over the seeds, of docs/demo.md's per-seed table: not one run's digits.
    demo = (Path(__file__).resolve().parents[1] / "docs" / "demo.md").read_text(encoding="utf-8")
    seeds = demo.split("### Three seeds", 1)[1]
    rows = [line.split("|")[2:-1] for line in seeds.splitlines() if re.match(r"\| \d \|", line)]
    assert len(rows) == 3
    columns = [[float(cell.split()[0]) for cell in column] for column in zip(*rows)]
    table = re.search(r"```text\n(.*?)```", README, re.DOTALL).group(1).splitlines()
    for framework, cells in (("torch", columns[:4]), ("jax", columns[4:])):
        line = next(row for row in table if row.startswith(framework))
        shown = re.findall(r"(\d+\.\d\d)–(\d+\.\d\d) dB", line)
        assert [(float(lo), float(hi)) for lo, hi in shown] == [(min(c), max(c)) for c in cells], framework


def test_the_readme_does_not_offer_to_open_the_site_as_a_file():
    assert "open `site/index.html`" not in README and "python -m http.server -d site" in README
