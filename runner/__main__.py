from runner.cli import main
from runner.runtime.process_end import exit_now

try:
    main()
except SystemExit as exc:
    exit_now(exc.code)
exit_now(0)
