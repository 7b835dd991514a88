"""Graded tasks of week 40, one module per topic: CuTe layouts (cute_tasks), the compiled kernel read (compiler_tasks),
linear and block-sparse attention (attention_tasks), the roofline (roofline_tasks), the capstone block (capstone_tasks)."""
from .attention_tasks import ATTENTION_TASKS
from .capstone_tasks import CAPSTONE_TASKS
from .compiler_tasks import COMPILER_TASKS
from .cute_tasks import CUTE_TASKS
from .roofline_tasks import ROOFLINE_TASKS

TASKS = {t.id: t for t in [*CUTE_TASKS, *COMPILER_TASKS, *ATTENTION_TASKS, *ROOFLINE_TASKS, *CAPSTONE_TASKS]}
