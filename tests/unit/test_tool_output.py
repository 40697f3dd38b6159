"""distill/tool_output on real tool output: what the log keeps, and the noise it drops.

The fixtures are verbatim outputs in ``tests/data/tool_output/``; its README says
where each came from (the tool, its version and the command, or the page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lore_gateway.distill import extractive, tool_output
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.distill.format import LOW, MEDIUM
from lore_gateway.distill.tool_output import Findings

DATA = Path(__file__).parents[1] / "data" / "tool_output"


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def read(name: str, command: str = "") -> Findings:
    return tool_output.findings(text(name), command)


def log(name: str, command: str = "") -> str:
    """The observations the output adds to the log, one per line."""
    return "\n".join(line for _, line in read(name, command).lines(command))


def assert_dropped(kept: str, *noise: str) -> None:
    for item in noise:
        assert item not in kept, item


# Python


def test_pytest_summary_failed_tests_and_decisive_errors() -> None:
    found = read("pytest_failures.txt")
    assert found.results == ("5 failed, 2 passed in 0.82s",)
    assert found.failed == ("test_calc.py::test_add_wrong", "test_calc.py::test_parse_bad",
                            "test_calc.py::test_load_missing",
                            "test_calc.py::CalcCase::test_add_bad",
                            "test_calc.py::CalcCase::test_parse_error")
    # The first errors and the last, each with the crash site pytest printed.
    assert found.errors == (
        "AssertionError: assert 4 == 5 (at test_calc.py:11)",
        "ValueError: invalid literal for int() with base 10: 'nope' (at calc.py:11)",
        "ValueError: invalid literal for int() with base 10: 'zz' (at calc.py:11)")
    assert_dropped(log("pytest_failures.txt"), "PytestDeprecationWarning", "[100%]",
                   "platform linux", "rootdir", "short test summary")


def test_pytest_quiet_summary_without_rules() -> None:
    found = read("pytest_quiet_deselected.txt")
    assert found.results == ("1 failed, 2 passed, 4 deselected in 1.11s",)
    assert found.failed == ("test_calc.py::CalcCase::test_add_bad",)
    assert found.errors == ("AssertionError: 2 != 3 (at test_calc.py:27)",)


def test_unittest_summary_failed_names_and_traceback_frames() -> None:
    found = read("unittest_verbose.txt")
    assert found.results == ("Ran 3 tests; FAILED (failures=1, errors=1) (in 0.001s)",)
    assert found.failed == ("test_add_bad (test_calc.CalcCase.test_add_bad)",
                            "test_parse_error (test_calc.CalcCase.test_parse_error)")
    assert found.errors == (
        "ValueError: invalid literal for int() with base 10: 'zz' "
        "(at /tmp/toolcap/py/calc.py:11 in parse)",
        "AssertionError: 2 != 3 (at /tmp/toolcap/py/test_calc.py:27 in test_add_bad)")
    assert "test_add_ok" not in log("unittest_verbose.txt")  # a passing test


def test_python_traceback_keeps_the_exception_and_the_innermost_frame() -> None:
    assert read("python_traceback.txt").errors == (
        "KeyError: 'port' (at /tmp/toolcap/py/boom.py:5 in read_config)",)
    assert_dropped(log("python_traceback.txt"), "line 12", "<module>", "~~~")


def test_ruff_summary_and_located_rules_in_both_formats() -> None:
    full = read("ruff_full.txt")
    assert full.results == ("Found 2 errors.",)
    assert full.errors == ("F401 [*] `os` imported but unused (at calc.py:1:8)",
                           "F401 [*] `sys` imported but unused (at calc.py:2:8)")
    concise = read("ruff_concise.txt")
    assert concise.results == ("Found 2 errors.",)
    assert concise.errors == ("calc.py:1:8: F401 [*] `os` imported but unused",
                              "calc.py:2:8: F401 [*] `sys` imported but unused")
    assert_dropped(log("ruff_full.txt"), "fixable", "help:", "Remove unused import")


def test_mypy_summary_errors_and_success() -> None:
    kept = log("mypy_errors.txt", "mypy --strict calc.py")
    assert "Result in `mypy --strict calc.py`: Found 4 errors in 1 file (checked 1 source file)" \
        in kept
    assert "calc.py:5: error: Function is missing a type annotation [no-untyped-def]" in kept
    assert "calc.py:19: error: Unsupported operand types for + (\"str\" and \"list[int]\")" \
        in kept
    assert read("mypy_success.txt").results == ("Success: no issues found in 1 source file",)


# JavaScript / TypeScript


def test_jest_summary_failed_names_and_errors() -> None:
    found = read("jest_failures.txt")
    assert found.results == ("Test Suites: 1 failed, 1 total", "Tests: 2 failed, 1 passed, 3 total")
    assert found.failed == ("cart › discount applies the rate",
                            "cart › checkout without a coupon")
    assert found.errors == (
        "expect(received).toBe(expected): Expected: 80, Received: 90 "
        "(at test/cart.test.js:8:32 in Object.toBe)",
        "TypeError: Cannot read properties of undefined (reading 'apply') "
        "(at src/cart.js:15:24 in Cart.apply [as checkout])")
    assert_dropped(log("jest_failures.txt"), "total sums price times qty", "Snapshots",
                   "Time:", "Ran all test suites")


def test_vitest_with_and_without_colour() -> None:
    for name in ("vitest_failures.txt", "vitest_failures_color.txt"):
        found = read(name)
        assert found.results == ("Test Files 1 failed (1)", "Tests 2 failed | 1 passed (3)")
        assert found.failed == ("vt/cart.spec.mjs > cart > discount applies the rate",
                                "vt/cart.spec.mjs > cart > checkout without a coupon")
        assert found.errors == (
            "AssertionError: expected 90 to be 80 // Object.is equality "
            "(at vt/cart.spec.mjs:10:32)",
            "TypeError: Cannot read properties of undefined (reading 'apply') "
            "(at src/cart.js:15:24 in Cart.checkout)")
        assert_dropped(log(name), "\x1b", "total sums price times qty", "Duration", "Start at")


def test_mocha_summary_failed_names_and_assertion() -> None:
    found = read("mocha_failures.txt")
    assert found.results == ("1 passing (4ms)", "2 failing")
    assert found.failed == ("discount applies the rate", "checkout without a coupon")
    assert found.errors[0] == ("AssertionError [ERR_ASSERTION]: Expected values to be strictly "
                               "equal: 90 !== 80 (at mt/cart.test.js:9:12 in Context.<anonymous>)")
    assert "total sums price times qty" not in log("mocha_failures.txt")


def test_node_uncaught_error_and_its_user_frame() -> None:
    assert read("node_uncaught.txt").errors == (
        "TypeError: Cannot read properties of undefined (reading 'apply') "
        "(at /tmp/toolcap/js/src/cart.js:15:24 in Cart.checkout)",)
    assert_dropped(log("node_uncaught.txt"), "node:internal", "Node.js v20", "Module._compile")


def test_bun_summary_failed_names_and_expectation() -> None:
    failure = read("bun_test_failure.txt")
    assert failure.results == ("0 pass", "1 fail", "Ran 1 tests across 1 files. [28.00ms]")
    assert failure.failed == ("save array of JSON in ~/src/data",)
    assert failure.errors == ("expect(received).toBe(expected): Expected: 5, Received: 4 "
                              "(at /Users/nikiv/src/ts/lib/file.test.ts:13:2)",)
    assert_dropped(log("bun_test_failure.txt"), "run!!", "expect() calls", "data dir")
    no_colour = read("bun_test_fail_no_color.txt")
    assert no_colour.failed == ("this one fails intermittently",)
    assert no_colour.results == ("1 pass", "1 fail", "Ran 2 tests across 2 files. [41.00ms]")
    passing = read("bun_test_no_color.txt")
    assert passing.results == ("4 pass", "0 fail", "Ran 4 tests across 1 files. [0.66ms]")
    assert passing.failed == () and "package.json" not in log("bun_test_no_color.txt")


def test_tsc_errors_with_and_without_its_summary() -> None:
    plain = read("tsc_errors.txt")
    assert plain.results == ()  # not a terminal: tsc prints no "Found" line
    assert plain.errors == (
        "src/main.ts(4,9): error TS2322: Type 'string' is not assignable to type 'number'.",
        "src/main.ts(5,21): error TS2739: Type 'Wallet' is missing the following properties "
        "from type 'Money': amount, currency",
        "src/money.ts(21,5): error TS2322: Type 'string' is not assignable to type 'number'.")
    pretty = read("tsc_errors_pretty.txt")
    assert pretty.results == ("Found 4 errors in 2 files.",)
    assert pretty.errors[0] == ("src/main.ts:4:9 - error TS2322: Type 'string' is not "
                                "assignable to type 'number'.")
    assert_dropped(log("tsc_errors_pretty.txt"), "Errors  Files", "~~~", "w.add(")


def test_eslint_summary_located_errors_and_minor_warnings() -> None:
    found = read("eslint_problems.txt")
    assert found.results == ("✖ 5 problems (3 errors, 2 warnings)",)
    assert found.errors[0] == ("/tmp/toolcap/js/src/util.js:1:5 'unused' is assigned a value "
                               "but never used no-unused-vars")
    assert found.errors[-1] == "/tmp/toolcap/js/src/util.js:4:37 'fallbak' is not defined no-undef"
    marks = {line.split(":")[0]: mark for mark, line in found.lines()}
    assert marks["Warning"] == LOW and marks["Error"] == MEDIUM
    assert "fixable with the `--fix` option" not in log("eslint_problems.txt")


def test_npm_pnpm_yarn_errors_without_their_boilerplate() -> None:
    assert read("npm_missing_script.txt").errors == ('npm error Missing script: "nosuch"',)
    assert_dropped(log("npm_missing_script.txt"), "complete log", "To see a list of scripts")
    old_npm = read("npm_err_elifecycle.txt")
    assert old_npm.results == ("Test Suites: 20 passed, 20 total", "Tests: 26 passed, 26 total")
    assert old_npm.errors == (
        "npm ERR! idp@0.0.0 test:app: `jest --config ./jest.app.config.js --no-cache`",
        "npm ERR! Failed at the idp@0.0.0 test:app script.")
    assert_dropped(log("npm_err_elifecycle.txt"), "probably not a problem", "debug.log",
                   "ELIFECYCLE", "Snapshots")
    assert read("pnpm_recursive_fail.txt").errors == (
        "ERR_PNPM_RECURSIVE_RUN_FIRST_FAIL decode-viewer@0.0.0 build: `tsc && vite build`",
        "ERR_PNPM_RECURSIVE_RUN_FIRST_FAIL papi-react-template@0.0.0 build: `tsc && vite build`")
    # The shell's own line names the cause; yarn's "Command failed" adds nothing then.
    assert read("yarn_command_failed.txt").errors == ("/bin/sh: 1: electron: not found",)
    assert read("npm_run_build_tsc.txt").errors[0].startswith(
        "ts/src/main.ts(4,9): error TS2322:")


# Go (go is not installed: outputs from go.dev and GitHub threads, see the README)


def test_go_test_failure_summary_and_message() -> None:
    found = read("go_test_fail.txt")
    assert found.results == ("FAIL example.com/greetings 0.182s",)
    assert found.failed == ("TestHelloName",)
    assert found.errors == ('greetings_test.go:15: Hello("Gladys") = "Hail, %v! Well met!", '
                            "<nil>, want match for `\\bGladys\\b`, nil",)
    assert "exit status 1" not in log("go_test_fail.txt")


def test_go_test_passing_and_several_packages() -> None:
    passing = read("go_test_verbose_pass.txt")
    assert passing.results == ("ok example.com/greetings 0.372s",)
    assert passing.failed == () and "TestHelloName" not in log("go_test_verbose_pass.txt")
    packages = read("go_test_packages.txt")
    assert packages.results == ("FAIL github.com/foo/bar/pkg/log/testlog 1.417s",
                                "ok github.com/foo/bar/pkg/log 0.005s")
    assert packages.failed == ("TestOutput2",)
    assert "testlog_test.go:42: was asked to fail" in packages.errors


def test_go_panic_keeps_the_first_frame_of_the_users_code() -> None:
    assert read("go_panic.txt").errors == (
        "panic: runtime error: index out of range [1] with length 1 "
        "(at /hidden/hidden/hidden/oniongen-go/main.go:92 in main.main)",)
    # The innermost frame is the standard library's (os/exec); the next is the program's.
    assert read("go_panic_library_frame.txt").errors == (
        "panic: runtime error: invalid memory address or nil pointer dereference "
        "(at /go/src/github.com/maxcnunes/gaper/runner.go:159 in "
        "github.com/maxcnunes/gaper.(*runner).runBin.func1)",)
    assert_dropped(log("go_panic_library_frame.txt"), "exec.go", "goroutine 154", "SIGSEGV")


# Rust


def test_cargo_test_summary_failed_names_and_panics() -> None:
    for name in ("cargo_test_failures.txt", "cargo_test_failures_backtrace.txt"):
        found = read(name)
        assert "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out;" \
            in found.results[-1]
        assert set(found.failed) == {"tests::withdraw_subtracts", "tests::parse_rejects_garbage"}
        assert ("thread 'tests::withdraw_subtracts' panicked at src/lib.rs:42:9: assertion "
                "`left == right` failed: left: 3, right: 2") in found.errors
        assert ("thread 'tests::parse_rejects_garbage' panicked at src/lib.rs:24:25: called "
                "`Result::unwrap()` on an `Err` value: ParseIntError { kind: InvalidDigit }") \
            in found.errors
        assert_dropped(log(name), "deposit_adds", "/rustc/", "core::panicking", "(3972)")
    ok = read("cargo_test_ok.txt").results
    assert ok[-1] == ("test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; "
                      "0 filtered out; finished in 0.00s")
    assert not any("ok. 0 passed" in r for r in ok)  # the empty doc-test run


def test_cargo_build_error_warning_and_summary() -> None:
    found = read("cargo_build_error.txt")
    assert found.errors == ("error[E0382]: borrow of moved value: `v` (at src/lib.rs:54:5)",)
    assert ("error: could not compile `calc` (lib) due to 1 previous error; 1 warning emitted"
            in found.results)
    assert found.warnings == ("warning: unused variable: `unused` (at src/lib.rs:52:9)",)
    assert_dropped(log("cargo_build_error.txt"), "help: consider cloning", "rustc --explain",
                   "Compiling calc")
    built = read("cargo_build_warning.txt")
    assert built.results[-1] == ("Finished `dev` profile [unoptimized + debuginfo] target(s) "
                                 "in 0.07s")
    assert built.errors == ()
    assert read("cargo_run_panic.txt").errors == (
        "thread 'main' panicked at src/lib.rs:24:25: called `Result::unwrap()` on an `Err` "
        "value: ParseIntError { kind: InvalidDigit }",)


# Java


def test_javac_errors_and_count() -> None:
    found = read("javac_errors.txt")
    assert found.results == ("2 errors",)
    assert found.errors == (
        "src/com/acme/Broken.java:5: error: incompatible types: String cannot be converted to int",
        "src/com/acme/Broken.java:6: error: cannot find symbol")


def test_java_exception_keeps_the_cause_and_the_users_frames() -> None:
    assert read("java_exception.txt").errors == (
        "java.lang.IllegalStateException: bad quantity: 3x "
        "(at Orders.java:22 in com.acme.Orders.parseQuantity); caused by "
        "java.lang.NumberFormatException: For input string: \"3x\" "
        "(at Orders.java:20 in com.acme.Orders.parseQuantity)",)
    assert "java.base" not in log("java_exception.txt")


def test_maven_surefire_and_compiler() -> None:
    tests = read("maven_test_failures.txt")
    assert tests.results == ("Tests run: 3, Failures: 1, Errors: 1, Skipped: 0", "BUILD FAILURE")
    assert tests.failed == ("com.acme.OrdersTest.totalOfEmptyIsOne",
                            "com.acme.OrdersTest.parsesQuantity")
    assert tests.errors[0] == ("org.opentest4j.AssertionFailedError: expected: <1> but was: <0> "
                               "(at OrdersTest.java:16 in com.acme.OrdersTest.totalOfEmptyIsOne)")
    assert_dropped(log("maven_test_failures.txt"), "[INFO]", "Help 1", "Re-run Maven",
                   "maven-surefire-plugin:3.2.5:test", "org.junit")
    compiled = read("maven_compile_error.txt")
    assert compiled.errors[0] == ("/tmp/toolcap/mvn/src/main/java/com/acme/Broken.java:[5,17] "
                                  "incompatible types: java.lang.String cannot be converted to int")
    assert "Failed to execute goal" not in log("maven_compile_error.txt")


# git, gh, HTTP


def test_git_commit_push_and_pull() -> None:
    assert read("git_commit.txt").results == (
        "[main 3349773] Fix the slug lookup in app.py",
        "3 files changed, 4 insertions(+), 2 deletions(-)")
    assert read("git_commit_root.txt").results[0] == "[main (root-commit) 12b7b85] Initial commit"
    assert_dropped(log("git_commit.txt"), "delete mode", "create mode")
    assert read("git_push.txt").results == ("12b7b85..3349773 main -> main",)
    assert read("git_push_new_branch.txt").results == ("* [new branch] main -> main",)
    assert read("git_push_rejected.txt").errors == ("! [rejected] main -> main (fetch first)",)
    assert "hint:" not in log("git_push_rejected.txt")
    assert read("git_pull.txt").results == ("e330293..27f9039 main -> origin/main",
                                            "Merge made by the 'ort' strategy.",
                                            "1 file changed, 1 insertion(+)")


def test_git_merge_and_rebase() -> None:
    assert read("git_merge.txt").results == ("Merge made by the 'ort' strategy.",
                                             "1 file changed, 1 insertion(+)")
    assert read("git_merge_fast_forward.txt").results == (
        "Updating 6b780c7..0841784", "Fast-forward", "1 file changed, 1 insertion(+)")
    assert read("git_merge_conflict.txt").errors == (
        "CONFLICT (content): Merge conflict in app.py",)
    # The progress line ends in a carriage return: what the terminal shows is kept.
    assert read("git_rebase.txt").results == (
        "Successfully rebased and updated refs/heads/topic.",)
    assert read("git_rebase_conflict.txt").errors == (
        "CONFLICT (content): Merge conflict in app.py",
        "error: could not apply 1b53e67... topic2 edits app")
    assert "Rebasing (1/1)" not in log("git_rebase.txt")


def test_gh_pr_create_keeps_the_url() -> None:
    assert log("gh_pr_create.txt", "gh pr create") == (
        "Result in `gh pr create`: https://github.com/OWNER/REPO/pull/12")


def test_http_status_line_and_curl_error() -> None:
    assert read("curl_include_404.txt").results == ("HTTP/1.0 404 File not found",)
    assert_dropped(log("curl_include_404.txt"), "Content-Type", "<html", "Error response")
    assert read("curl_refused.txt").errors == (
        "curl: (7) Failed to connect to 127.0.0.1 port 1 after 0 ms: Couldn't connect to server",)


# Definitions


def _where(d: Any) -> str:
    """A definition's name and place (its rendering also quotes its signature)."""
    return f"`{d.name}` at {d.path}:{d.line}"


def test_definitions_take_the_file_from_a_one_file_command_in_any_language() -> None:
    assert log("grep_python_single_file.txt", 'grep -n "def \\|class " calc.py').endswith(
        "Defined: calc.py:5:def add(a, b):; calc.py:9:class Parser:; "
        "calc.py:10:def parse(self, text: str) -> int:; calc.py:14:def load(path):; "
        "calc.py:18:def total(items: list[int]) -> int:")
    go = read("grep_go_single_file.txt", 'grep -n "^func \\|^type " server.go')
    assert [_where(d) for d in go.definitions] == [
        "`Handler` at server.go:5", "`Router` at server.go:9", "`New` at server.go:13",
        "`ServeHTTP` at server.go:17"]  # TestNothing is a test
    ts = read("grep_ts_single_file.txt", 'grep -n "export" src/money.ts')
    assert [_where(d) for d in ts.definitions] == [
        "`Money` at src/money.ts:1", "`Rate` at src/money.ts:6", "`convert` at src/money.ts:8",
        "`format` at src/money.ts:12", "`Wallet` at src/money.ts:14"]
    # Without a file in the command the line number stands alone, as grep -n shows it.
    assert str(read("grep_python_single_file.txt").definitions[0]) == "5:def add(a, b):"
    assert str(read("grep_python_single_file.txt", "grep -n def a.py b.py").definitions[0]) \
        == "5:def add(a, b):"


def test_definitions_from_cat_n_views_include_methods() -> None:
    ts = read("cat_n_typescript.txt", "cat -n src/money.ts")
    assert [_where(d) for d in ts.definitions][-2:] == ["`add` at src/money.ts:16",
                                                     "`total` at src/money.ts:19"]
    rust = read("cat_n_rust.txt", "cat -n src/lib.rs | head -26")
    assert [_where(d) for d in rust.definitions] == [
        "`Account` at src/lib.rs:1", "`Op` at src/lib.rs:5", "`Ledger` at src/lib.rs:10",
        "`apply` at src/lib.rs:11", "`impl Ledger for Account` at src/lib.rs:14",
        "`apply` at src/lib.rs:15", "`parse_amount` at src/lib.rs:23"]
    assert "Deposit(n)" not in log("cat_n_rust.txt", "cat -n src/lib.rs")


def test_definitions_from_recursive_grep_name_their_files() -> None:
    js = read("grep_js_definitions.txt", "grep -rn function src")
    assert [_where(d) for d in js.definitions] == [
        "`pick` at src/util.js:3", "`total` at src/cart.js:1", "`discount` at src/cart.js:5",
        "`Cart` at src/cart.js:7"]
    rust = [_where(d) for d in read("grep_rust_definitions.txt").definitions]
    assert "`main` at src/bin/run.rs:3" in rust and "`consume` at src/lib.rs:51" in rust
    java = [_where(d) for d in read("grep_java_definitions.txt").definitions]
    assert java == ["`Broken` at src/com/acme/Broken.java:3",
                    "`name` at src/com/acme/Broken.java:4",
                    "`Orders` at src/com/acme/Orders.java:5",
                    "`Priced` at src/com/acme/Orders.java:6",
                    "`total` at src/com/acme/Orders.java:10",
                    "`parseQuantity` at src/com/acme/Orders.java:18",
                    "`main` at src/com/acme/Orders.java:26"]


def test_definitions_after_a_sed_range_count_from_its_first_line() -> None:
    found = read("sed_range_grep_rust.txt", "sed -n '10,25p' src/lib.rs | grep -n \"fn \"")
    assert [_where(d) for d in found.definitions] == [
        "`apply` at src/lib.rs:11", "`apply` at src/lib.rs:15", "`parse_amount` at src/lib.rs:23"]


# Within one output, and through the distiller


def test_a_finding_repeated_in_one_output_is_kept_once() -> None:
    eight_runs = text("mypy_success.txt") * 8  # a loop that ran mypy eight times
    assert tool_output.findings(eight_runs).lines() == [
        (MEDIUM, "Result: Success: no issues found in 1 source file")]
    twice = text("node_uncaught.txt") * 2
    assert len(tool_output.findings(twice).errors) == 1


def test_the_extractive_log_carries_the_findings_of_a_long_output() -> None:
    at = 1_796_000_000.0
    log_text = extractive.distill([
        SourceMessage(1, "user", "Fix the cart checkout.", at),
        SourceMessage(2, "assistant", "Running the tests.\n\n```bash\nnpx jest\n```", at + 60),
        SourceMessage(3, "tool", text("jest_failures.txt"), at + 120)])
    assert "Tests: 2 failed, 1 passed, 3 total" in log_text
    assert "cart › checkout without a coupon" in log_text
    assert "TypeError: Cannot read properties of undefined (reading 'apply') " \
           "(at src/cart.js:15:24" in log_text
    assert "total sums price times qty" not in log_text
