# Every target creates the environment in $(VENV) when it is missing (python3 >= 3.11 needed).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WEEK   ?=
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile

.PHONY: env lab test site grade solutions bench doctor clean

env: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m ipykernel install --prefix $(VENV) --name python3 > /dev/null
	touch $(STAMP)

lab: $(STAMP)
	$(PY) -m course doctor
	$(VENV)/bin/jupyter lab notebooks/

# Unit and grader tests, mutants, stub/solution sync, every notebook run by nbval against the
# reference solutions, and the built site opened in headless Chromium (tests/test_site.py).
test: site
	COURSE_SOLUTIONS=1 $(PYTEST) --nbval-lax tests notebooks

# The course as a static site in _build/html, notebooks executed with the reference solutions.
# Execution is cached in _build/.jupyter_cache: an unchanged notebook is not run again.
# Warnings (broken references, missing images) and cell errors fail the build.
site: $(STAMP)
	$(PY) -m course.site
	COURSE_SOLUTIONS=1 $(VENV)/bin/jupyter-book build . --config book/_config.yml --toc _build/toc.yml \
		-W --keep-going -q
	@echo "site: open _build/html/index.html"

# make grade            -> every exercise;  make grade WEEK=33 -> one week
grade: $(STAMP)
	$(PY) -m course grade $(if $(WEEK),w$(WEEK),all)

# Run every notebook top to bottom against the reference solutions.
solutions: $(STAMP)
	COURSE_SOLUTIONS=1 $(PYTEST) --nbval-lax notebooks

# On a GPU: every week's benchmark; results land in course/results/.
bench: $(STAMP)
	$(PY) -m course bench all

doctor: $(STAMP)
	$(PY) -m course doctor

clean:
	rm -rf _build .pytest_cache
	find . -name __pycache__ -prune -not -path './$(VENV)/*' -exec rm -rf {} +
	find . -name .ipynb_checkpoints -prune -not -path './$(VENV)/*' -exec rm -rf {} +
