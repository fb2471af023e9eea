//! Errors of the plain-Rust layers, each carrying the SQLSTATE it is reported with.
//!
//! The registry, broker, provider and segment modules never call into PostgreSQL; they return
//! `UvmError`, and only the backend runtime (`crate::runtime::report`) turns one into an
//! `ereport(ERROR)`. Every variant of [`Code`] maps to a specific SQLSTATE, never `XX000`: an
//! error a user can cause is one a user can read and act on.

use std::fmt;

/// Declares an enum whose values travel or are stored as numbers (a wire protocol, a shared
/// memory word), with its numbers written once: the enum with `#[repr($repr)]` and the given
/// discriminants, and `from_repr`, the total decoding (`None` for any other number), made from
/// the same list. `as` encodes.
#[macro_export]
macro_rules! wire_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident: $repr:ident {
        $($(#[$vmeta:meta])* $variant:ident = $value:expr),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr($repr)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $value),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value numbered `v`, if any.
            pub fn from_repr(v: $repr) -> Option<$name> {
                $(if v == $value {
                    return Some($name::$variant);
                })+
                None
            }
        }
    };
}

crate::wire_enum! {
    /// The SQLSTATE classes this extension reports. Names follow PostgreSQL's `errcodes.txt`.
    /// The numbers are what a GPU service reply carries (`exec::request`): fixed, append only.
    pub enum Code: u32 {
        /// 22023: a size, offset, tier or option that can never be valid.
        InvalidParameterValue = 0,
        /// 22004: a NULL where a value is required.
        NullValueNotAllowed = 1,
        /// 2202E: an offset or length outside the segment's current size.
        OutOfRange = 2,
        /// 42602: an empty name.
        InvalidName = 3,
        /// 42622: a name longer than `NAMEDATALEN - 1` bytes.
        NameTooLong = 4,
        /// 42804: a value of the wrong type (a key type mismatch).
        DatatypeMismatch = 5,
        /// 42704: no segment of that name.
        UndefinedObject = 6,
        /// 42710: a segment of that name exists already.
        DuplicateObject = 7,
        /// 42501: the caller lacks the owner role's privileges.
        InsufficientPrivilege = 8,
        /// 54000: over the maximum segment size or another hard limit.
        ProgramLimitExceeded = 9,
        /// 53400: the registry is full; a GUC raises the limit.
        ConfigurationLimitExceeded = 10,
        /// 53200: the provider could not allocate memory.
        OutOfMemory = 11,
        /// 55006: the segment is pinned by another process.
        ObjectInUse = 12,
        /// 55000: the extension is not set up (not preloaded, broker not running).
        ObjectNotInPrerequisiteState = 13,
        /// 0A000: a tier or operation this provider does not have.
        FeatureNotSupported = 14,
        /// 55P03: a wait (for pins to drain, or for a migration to end) ran out of time.
        LockNotAvailable = 15,
        /// 58000: an operating-system call failed.
        SystemError = 16,
        /// 08P01: the broker answered something that is not the protocol.
        ProtocolViolation = 17,
        /// 22003: a result outside its type's range (an aggregate's int8 sum).
        NumericValueOutOfRange = 19,
        /// 42939: a segment name in the plan nodes' reserved namespace (`registry::RESERVED_PREFIX`).
        ReservedName = 20,
        /// 57014: the statement was cancelled (only a test's interrupt hook returns it: in
        /// PostgreSQL, `CHECK_FOR_INTERRUPTS()` raises the cancel itself).
        QueryCanceled = 18,
        /// 42703: a column the table does not have (a cache's columns).
        UndefinedColumn = 21,
        /// 22012: a scan program's integer division or modulo by zero.
        DivisionByZero = 22,
        /// 25000: an operation a parallel operation must not run (a cache's build).
        InvalidTransactionState = 23,
        /// 57P01: the process was told to exit (`pg_terminate_backend`, a fast shutdown) inside a
        /// long operation, which stops as on a cancel and leaves the exit to PostgreSQL's next
        /// interrupt check outside it (`crate::interrupt`).
        AdminShutdown = 24,
    }
}

impl Code {
    /// The five-character SQLSTATE.
    pub fn sqlstate(self) -> &'static str {
        match self {
            Code::InvalidParameterValue => "22023",
            Code::NullValueNotAllowed => "22004",
            Code::OutOfRange => "2202E",
            Code::InvalidName => "42602",
            Code::NameTooLong => "42622",
            Code::DatatypeMismatch => "42804",
            Code::UndefinedObject => "42704",
            Code::DuplicateObject => "42710",
            Code::InsufficientPrivilege => "42501",
            Code::ProgramLimitExceeded => "54000",
            Code::ConfigurationLimitExceeded => "53400",
            Code::OutOfMemory => "53200",
            Code::ObjectInUse => "55006",
            Code::ObjectNotInPrerequisiteState => "55000",
            Code::FeatureNotSupported => "0A000",
            Code::LockNotAvailable => "55P03",
            Code::SystemError => "58000",
            Code::ProtocolViolation => "08P01",
            Code::NumericValueOutOfRange => "22003",
            Code::QueryCanceled => "57014",
            Code::ReservedName => "42939",
            Code::UndefinedColumn => "42703",
            Code::DivisionByZero => "22012",
            Code::InvalidTransactionState => "25000",
            Code::AdminShutdown => "57P01",
        }
    }
}

/// What went wrong, where a caller decides on it (retry, fall back, give up): code decides, never
/// the message text, which is for people and free to change. Most errors are `Other`: their
/// [`Code`] says all a caller needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// Nothing more particular than the SQLSTATE.
    #[default]
    Other,
    /// An operating-system call failed with this `errno`.
    Os(i32),
    /// The connection to the broker failed (connect, send, receive, end of file): the request
    /// may not have reached the broker, and a fresh connection may succeed.
    BrokerConnection,
}

/// An error with its SQLSTATE, message, and optional detail and hint (as `ereport` has them),
/// and the [`Kind`] that code decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UvmError {
    pub code: Code,
    pub kind: Kind,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

pub type Result<T> = std::result::Result<T, UvmError>;

impl UvmError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        UvmError { code, kind: Kind::Other, message: message.into(), detail: None, hint: None }
    }

    /// The same error, marked with `kind` for callers that decide on it.
    pub fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// An OS error from `errno`, reported as 58000 (53200 for ENOMEM/ENOSPC), of kind
    /// [`Kind::Os`] when the error carries an errno.
    pub fn os(what: impl fmt::Display, err: std::io::Error) -> Self {
        let errno = err.raw_os_error();
        let code = match errno {
            Some(libc::ENOMEM) | Some(libc::ENOSPC) => Code::OutOfMemory,
            _ => Code::SystemError,
        };
        let e = UvmError::new(code, format!("{what}: {err}"));
        match errno {
            Some(n) => e.with_kind(Kind::Os(n)),
            None => e,
        }
    }

    /// `errno` of the last failed libc call.
    pub fn last_os(what: impl fmt::Display) -> Self {
        Self::os(what, std::io::Error::last_os_error())
    }
}

impl fmt::Display for UvmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code.sqlstate())
    }
}

impl std::error::Error for UvmError {}

/// Shorthand: `err!(Code::X, "format {}", args)`.
#[macro_export]
macro_rules! uvm_err {
    ($code:expr, $($fmt:tt)+) => {
        $crate::error::UvmError::new($code, format!($($fmt)+))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_carry_their_errno_and_sqlstate() {
        let e = UvmError::os("could not frob", std::io::Error::from_raw_os_error(libc::EBADF));
        assert_eq!((e.code, e.kind), (Code::SystemError, Kind::Os(libc::EBADF)));
        let e = UvmError::os("could not frob", std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert_eq!((e.code, e.kind), (Code::OutOfMemory, Kind::Os(libc::ENOMEM)));
        // an io::Error without an errno: no kind to decide on, the code stays 58000
        let e = UvmError::os("could not frob", std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        assert_eq!((e.code, e.kind), (Code::SystemError, Kind::Other));
        // a message saying "could not" is no longer a kind of anything
        assert_eq!(UvmError::new(Code::SystemError, "could not map").kind, Kind::Other);
    }
}
