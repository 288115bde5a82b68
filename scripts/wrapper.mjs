// What the test wrappers (scripts/with-postgres.mjs, scripts/with-s3.mjs) share: the command they
// were given, run once their server is up with the signals they get passed on to it; a claim on a
// port number, so that two runs at once do not race for one port; the tail of a server's log.
//
// A signal to the wrapper (SIGINT, SIGTERM, SIGHUP) is passed on to the command, and a second one,
// or a command still running 10 s later, kills it. One that comes while the server starts is
// handled once it has started (normally before the command runs), so the server is still stopped.
import { spawn } from 'node:child_process';
import { accessSync, closeSync, constants, existsSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { constants as osConstants } from 'node:os';

/** The command given to the wrapper `name` (its arguments, joined); without one, its usage and exit 2. */
export function commandOf(name, say) {
  const command = process.argv.slice(2).join(' ');
  if (command.trim() === '') {
    say(`usage: node scripts/${name}.mjs <command...>`);
    process.exit(2);
  }
  return command;
}

export function isExecutable(path) {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * Claim the port number `file` stands for, by writing this process's pid into it; a claim whose
 * process is gone is taken over. False when another live run holds it.
 */
export function claim(file) {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(file, 'wx');
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return true;
    } catch (e) {
      // Another user's claim can be refused with EACCES instead (protected_regular).
      if ((e.code === 'EACCES' || e.code === 'EPERM') && existsSync(file)) return false;
      if (e.code !== 'EEXIST') throw e;
      if (!stale(file)) return false;
      try {
        unlinkSync(file);
      } catch {
        // another run took it over first
      }
    }
  }
  return false;
}

/** Whether the claim `file` names a process that is gone. */
function stale(file) {
  let pid;
  try {
    pid = Number(readFileSync(file, 'utf8'));
  } catch {
    return false;
  }
  if (!Number.isInteger(pid) || pid <= 0) return true;
  try {
    process.kill(pid, 0);
    return false;
  } catch (e) {
    return e.code === 'ESRCH';
  }
}

/** Let go of the claim `file`, if it is still this process's. */
export function release(file) {
  try {
    if (readFileSync(file, 'utf8') === String(process.pid)) unlinkSync(file);
  } catch {
    // already gone
  }
}

/** The last `lines` lines of the server log `log`, to show with a failure. */
export function logTail(log, lines = 40) {
  let text = '';
  try {
    text = readFileSync(log, 'utf8').trimEnd();
  } catch {
    // not written
  }
  if (text === '') return `(nothing in the server log ${log})`;
  return `--- last lines of ${log} ---\n${text.split('\n').slice(-lines).join('\n')}\n---`;
}

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
