"""Distillation commands: `distill` (a corpus translated by a teacher), `student` (the whole pipeline: teacher, distillation, student, exports) and its resumable `stages`."""
