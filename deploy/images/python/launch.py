"""Kiln's sandbox launcher: the image entrypoint that waits for one job and
runs it, or, in a box, becomes the box's zygote (box.py).

The container can be started (prepared) before any job exists; this process then
blocks on stdin. The runtime delivers exactly one job over that pipe, a frame
of the launcher protocol (kilnproto.py) followed by the job's own stdin:

    KILN/<major>.<minor> <n>\\n
    <n bytes of JSON: {"code": str, "args": [str], "env": {str: str},
                       "files": [{"name": str, "data": base64}]}>
    <the job's own stdin bytes, until EOF>

The frame is read with os.read on fd 0, byte-exact, so nothing of the job's
stdin is swallowed by a read-ahead buffer; then the program runs in this same
interpreter (runner.py), so a job costs one interpreter start.

The environment (the kiln-init protocol, sandbox/initproto), each variable
removed so the job never sees it:
    KILN_READY_FD   a descriptor to write one byte to, and close, once the
                    frame is read and the input files written, before any
                    of the job's code runs
    KILN_OUTPUT_FD  the output channel (display outputs and the exception:
                    runner.py)
    KILN_PRELOAD    modules to import while waiting for the job (a pooled
                    sandbox, or a box's zygote): preloader.py
    KILN_BOX        a box's control socket: this process becomes the zygote

Exit codes: whatever the program exits with; 1 for an uncaught exception or a
syntax error (as CPython); LAUNCH_ERROR (125) for a frame it cannot read or
a protocol version it does not speak, which is the platform's fault, not the
program's, and is flagged on stderr with the "kiln-launcher:" prefix.
"""

import os
import sys

# The launcher's modules sit beside it, and -P keeps the script's directory
# off sys.path; runner.forget_launcher takes it off again before a program
# runs.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kilnproto  # noqa: E402
import runner  # noqa: E402


def main():
    ready_fd = os.environ.pop("KILN_READY_FD", None)
    modules = os.environ.pop("KILN_PRELOAD", "")
    ctl = os.environ.pop("KILN_BOX", "")
    out_fd = runner.output_fd(os.environ.pop("KILN_OUTPUT_FD", ""))
    runner.matplotlib_defaults()
    if ctl:
        # A box: this process becomes the zygote that forks every job into
        # a fresh inner sandbox. Its user namespace is made before
        # preloading: a process that started threads (OpenBLAS does, at
        # import) cannot make one.
        import box

        zygote = box.enter(ctl, preloads=bool(modules))
        if modules:
            import preloader

            preloader.preload(modules)
        zygote.serve(ready_fd)
        return
    if modules:
        import preloader

        preloader.preload(modules)
        # The worker hands this sandbox a job only after this line.
        os.write(1, runner.PRELOADED)
    try:
        n = kilnproto.read_header(0)
        code, args, env, files, _ = kilnproto.decode_job(kilnproto.read_exact(0, n))
    except kilnproto.ProtocolError as e:
        kilnproto.fail(str(e))
    runner.run_job(code, args, env, files, lambda: runner.signal_ready(ready_fd), fast=bool(modules), out_fd=out_fd)


if __name__ == "__main__":
    main()
