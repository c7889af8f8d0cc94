//! How a command fails: one line on stderr starting `spool: `, and an exit code
//! (CLI.md): 1 the command failed, 3 `verify` found damage. Usage errors (2) are clap's.

use std::process::ExitCode;

/// Exit code of a command that failed.
const FAILED: u8 = 1;
/// Exit code of `verify` finding damage.
const DAMAGED: u8 = 3;

/// A failed command: what to print and how to exit.
#[derive(Debug)]
pub struct Failure {
    message: String,
    code: u8,
    /// The data itself is damaged (`Error::Corrupt` at open): damage for `verify`.
    corrupt: bool,
}

impl Failure {
    /// Exit 1 with `message` (which says what to do).
    pub fn failed(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: FAILED,
            corrupt: false,
        }
    }

    /// Exit 3: damage found (the report is already printed, or `message` says where).
    pub fn damaged(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: DAMAGED,
            corrupt: true,
        }
    }

    /// For `verify`: an open that damaged data stopped is damage (exit 3); any other
    /// failure stays what it is.
    pub fn into_damage(self) -> Failure {
        if self.corrupt {
            Failure::damaged(self.message)
        } else {
            self
        }
    }

    /// The same failure, told after what had already been done: `done; then: message`.
    pub fn after(self, done: String) -> Failure {
        Failure {
            message: format!("{done}; then: {}", self.message),
            ..self
        }
    }

    /// What went wrong, as the line says it.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prints the line and gives the exit code.
    pub fn report(self) -> ExitCode {
        eprintln!("spool: {}", self.message);
        ExitCode::from(self.code)
    }
}

impl From<spool::Error> for Failure {
    fn from(e: spool::Error) -> Self {
        let corrupt = matches!(e, spool::Error::Corrupt { .. });
        Failure {
            corrupt,
            ..Failure::failed(e.to_string())
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::failed(format!("cannot write the output: {e}"))
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Failure::failed(format!("cannot write the output: {e}"))
    }
}
