// Running the command a test wrapper (scripts/with-postgres.mjs, scripts/with-s3.mjs) was given,
// once its server is up, with the signals the wrapper gets passed on to it.
//
// A signal to the wrapper (SIGINT, SIGTERM, SIGHUP) is passed on to the command, and a second one,
// or a command still running 10 s later, kills it. One that comes while the server starts is
// handled once it has started (normally before the command runs), so the server is still stopped.
import { spawn } from 'node:child_process';
import { constants as osConstants } from 'node:os';

/**
 * Passes the wrapper's signals on from now on. Returns `runCommand(env)`, which runs `command`
 * through the shell with `env` and resolves to the exit code the wrapper should use; `say`
 * reports a command that could not be started.
 */
export function commandRunner(command, say) {
  let received = null;
  let signalChild = () => {};
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
      if (received) {
        signalChild('SIGKILL');
        return;
      }
      received = sig;
      signalChild(sig);
      setTimeout(() => signalChild('SIGKILL'), 10_000).unref();
    });
  }
  const signalExitCode = (sig) => 128 + (osConstants.signals[sig] ?? 0);
  return function runCommand(env) {
    if (received) return Promise.resolve(signalExitCode(received));
    // Outside a terminal the command gets its own process group, so a signal passed on reaches
    // everything it started, not only its shell. In a terminal it stays in the foreground group,
    // where Ctrl-C reaches it anyway and it may read the terminal.
    const ownGroup = !process.stdin.isTTY && process.platform !== 'win32';
    const child = spawn(command, { shell: true, stdio: 'inherit', env, detached: ownGroup });
    signalChild = (sig) => {
      try {
        if (ownGroup) process.kill(-child.pid, sig);
        else child.kill(sig);
      } catch {
        // already gone
      }
    };
    return new Promise((resolve) => {
      child.on('error', (e) => {
        say(`could not run the command: ${e.message}`);
        resolve(127);
      });
      child.on('exit', (code, signal) => {
        signalChild = () => {};
        const sig = received ?? signal;
        resolve(sig ? signalExitCode(sig) : code);
      });
    });
  };
}
