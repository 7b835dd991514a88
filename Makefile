# Every target creates the environment in $(VENV) when it is missing (python3 >= 3.11 needed).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WEEK   ?=
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile

.PHONY: env lab test site grade grade-notebooks solutions release release-check bench doctor clean

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

# The course as a static site, notebooks executed with the reference solutions. The learner's edition (the default,
# _build/html) shows an exercise's stub wherever a lesson shows its code (COURSE_SHOW=stubs); `make site SOLUTIONS=1`
# is the instructors' edition with the reference code (_build/html-instructors). Each edition caches execution in
# its own _build/.jupyter_cache-<edition>: an unchanged notebook is not run again.
# Warnings (broken references, missing images) and cell errors fail the build.
EDITION := $(if $(SOLUTIONS),instructors,learners)
site: $(STAMP)
	$(PY) -m course.site $(EDITION)
	COURSE_SOLUTIONS=1 COURSE_SHOW=$(if $(SOLUTIONS),solutions,stubs) $(VENV)/bin/jupyter-book build . \
		--config _build/config-$(EDITION).yml --toc _build/toc.yml $(if $(SOLUTIONS),--path-output _build/instructors) \
		-W --keep-going -q
	$(if $(SOLUTIONS),ln -sfn instructors/_build/html _build/html-instructors)
	@echo "site: open _build/html$(if $(SOLUTIONS),-instructors)/index.html"

# make grade            -> every exercise;  make grade WEEK=33 -> one week
grade: $(STAMP)
	$(PY) -m course grade $(if $(WEEK),w$(WEEK),all)

# Run every notebook top to bottom against the reference solutions.
solutions: $(STAMP)
	COURSE_SOLUTIONS=1 $(PYTEST) --nbval-lax notebooks

# The notebooks run top to bottom by nbval against the exercise files in course/exercises/, and a table of every
# grading cell's result.  make grade-notebooks WEEK=33 -> one week
grade-notebooks: $(STAMP)
	$(PY) -m course grade-notebooks --jobs 2 $(if $(WEEK),--week $(WEEK))

# The learner's edition (no solutions/, tests/, tools/, notes/; notebooks without outputs; a README and Makefile for
# learners): make release DEST=folder, or make release BRANCH=student (a commit on that branch, built from HEAD;
# the working tree and main are left alone).
release: $(STAMP)
	$(PY) -m course release $(DEST) $(if $(BRANCH),--branch $(BRANCH))

# Every week's notebooks in a fresh learner's edition: with the stubs only "not implemented yet" fails; with the
# reference solutions copied over the exercise files every cell passes. (make test does week 33 only.)
release-check: $(STAMP)
	COURSE_RELEASE_WEEKS=all $(PY) -m pytest -q -n 2 tests/test_release.py

# On a GPU: every week's benchmark; results land in course/results/.
bench: $(STAMP)
	$(PY) -m course bench all

doctor: $(STAMP)
	$(PY) -m course doctor

clean:
	rm -rf _build .pytest_cache
	find . -name __pycache__ -prune -not -path './$(VENV)/*' -exec rm -rf {} +
	find . -name .ipynb_checkpoints -prune -not -path './$(VENV)/*' -exec rm -rf {} +
