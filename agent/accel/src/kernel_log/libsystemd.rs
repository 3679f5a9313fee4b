//! libsystemd's sd-journal API, loaded at run time (`dlopen`), as node-problem-detector,
//! NVSentinel, eks-node-monitoring-agent and Grafana Alloy load it: the journal's own reader, which
//! follows only the entries a match selects (the per-value entry arrays, by bisection) and reads
//! only the fields asked for. The agent runs without it: `load` says why, and only the kernel log
//! source is off. The signatures are `sd-journal.h`'s (systemd 252, the version the image ships;
//! each exists since systemd 187 or earlier). libsystemd is LGPL-2.1-or-later, loaded by an
//! Apache-2.0 binary (docs/security.md).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;

#[repr(C)]
struct SdJournal {
    _private: [u8; 0],
}

type Handle = *mut SdJournal;

/// The functions the reader calls, copied out of the library (which [`Libsystemd`] keeps loaded).
struct Functions {
    open_files: unsafe extern "C" fn(*mut Handle, *const *const c_char, c_int) -> c_int,
    close: unsafe extern "C" fn(Handle),
    add_match: unsafe extern "C" fn(Handle, *const c_void, usize) -> c_int,
    seek_head: unsafe extern "C" fn(Handle) -> c_int,
    seek_cursor: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    test_cursor: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    next: unsafe extern "C" fn(Handle) -> c_int,
    get_data: unsafe extern "C" fn(Handle, *const c_char, *mut *const c_void, *mut usize) -> c_int,
    get_realtime_usec: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    get_cursor: unsafe extern "C" fn(Handle, *mut *mut c_char) -> c_int,
    wait: unsafe extern "C" fn(Handle, u64) -> c_int,
}

/// The loaded library.
pub struct Libsystemd {
    functions: Functions,
    /// Where it was loaded from, as asked (a name the dynamic loader found, or a path).
    pub name: PathBuf,
    // Last: the functions above point into it.
    _library: libloading::Library,
}

impl Libsystemd {
    /// Loads `name` (`libsystemd.so.0`, or a path). Err says what is missing and what to do.
    pub fn load(name: &Path) -> Result<Arc<Libsystemd>, String> {
        let missing = |e: libloading::Error| {
            format!(
                "cannot load {} ({e}): the kernel log is read through libsystemd's sd-journal; the agent's image ships Debian's libsystemd0 (set kernel_log.library to where it is)",
                name.display()
            )
        };
        // SAFETY: loading libsystemd runs its constructors, which only set up its own state.
        let library = unsafe { libloading::Library::new(name.as_os_str()) }.map_err(missing)?;
        macro_rules! function {
            ($symbol:literal) => {
                // SAFETY: the type the field declares is the function's signature in sd-journal.h;
                // the pointer is used only while `_library` keeps the library loaded.
                *unsafe { library.get(concat!($symbol, "\0").as_bytes()) }.map_err(missing)?
            };
        }
        let functions = Functions {
            open_files: function!("sd_journal_open_files"),
            close: function!("sd_journal_close"),
            add_match: function!("sd_journal_add_match"),
            seek_head: function!("sd_journal_seek_head"),
            seek_cursor: function!("sd_journal_seek_cursor"),
            test_cursor: function!("sd_journal_test_cursor"),
            next: function!("sd_journal_next"),
            get_data: function!("sd_journal_get_data"),
            get_realtime_usec: function!("sd_journal_get_realtime_usec"),
            get_cursor: function!("sd_journal_get_cursor"),
            wait: function!("sd_journal_wait"),
        };
        Ok(Arc::new(Libsystemd {
            functions,
            name: name.to_path_buf(),
            _library: library,
        }))
    }

    /// The journal made of exactly `files` (`sd_journal_open_files`): one that cannot be opened
    /// fails the whole call with its error (`EPROTONOSUPPORT` for an incompatible flag this
    /// libsystemd does not know). No file outside the list is ever added: the caller chooses them.
    pub fn open_files(self: &Arc<Self>, files: &[PathBuf]) -> Result<Journal, Errno> {
        let paths: Vec<CString> = files
            .iter()
            .map(|f| CString::new(f.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL))
            .collect::<Result<_, _>>()?;
        let mut pointers: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
        pointers.push(std::ptr::null());
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `pointers` is a NULL-terminated array of NUL-terminated strings that outlive the
        // call; `handle` is written only on success.
        let rc = unsafe { (self.functions.open_files)(&mut handle, pointers.as_ptr(), 0) };
        check(rc)?;
        Ok(Journal {
            handle,
            library: self.clone(),
        })
    }
}

fn check(rc: c_int) -> Result<c_int, Errno> {
    if rc < 0 {
        Err(Errno::from_raw(-rc))
    } else {
        Ok(rc)
    }
}

/// What `sd_journal_wait` saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing within the timeout.
    Nothing,
    /// Entries were appended.
    Appended,
    /// Files were added or removed.
    Invalidated,
}

/// An open journal (`sd_journal *`): one thread's, never shared (sd-journal is not thread-safe).
pub struct Journal {
    handle: Handle,
    library: Arc<Libsystemd>,
}

impl Journal {
    fn call(&self) -> &Functions {
        &self.library.functions
    }

    /// Adds a `FIELD=value` match: matches of one field are alternatives, of different fields all
    /// required.
    pub fn add_match(&mut self, field_value: &[u8]) -> Result<(), Errno> {
        // SAFETY: the handle is open; the bytes are read during the call only.
        check(unsafe {
            (self.call().add_match)(self.handle, field_value.as_ptr().cast(), field_value.len())
        })
        .map(drop)
    }

    pub fn seek_head(&mut self) -> Result<(), Errno> {
        // SAFETY: the handle is open.
        check(unsafe { (self.call().seek_head)(self.handle) }).map(drop)
    }

    /// Seeks to the entry `cursor` names, or the nearest one if it is gone (a file vacuumed).
    pub fn seek_cursor(&mut self, cursor: &CStr) -> Result<(), Errno> {
        // SAFETY: the handle is open; the cursor is a NUL-terminated string.
        check(unsafe { (self.call().seek_cursor)(self.handle, cursor.as_ptr()) }).map(drop)
    }

    /// Whether the current entry is the one `cursor` names.
    pub fn test_cursor(&mut self, cursor: &CStr) -> Result<bool, Errno> {
        // SAFETY: the handle is open; the cursor is a NUL-terminated string.
        check(unsafe { (self.call().test_cursor)(self.handle, cursor.as_ptr()) }).map(|r| r > 0)
    }

    /// Moves to the next entry the matches select; false at the end.
    pub fn advance(&mut self) -> Result<bool, Errno> {
        // SAFETY: the handle is open.
        check(unsafe { (self.call().next)(self.handle) }).map(|r| r > 0)
    }

    /// The current entry's `field` (its value, without `FIELD=`), decompressed; None when the
    /// entry has none. Valid until the journal is used again.
    pub fn data(&mut self, field: &CStr) -> Result<Option<&[u8]>, Errno> {
        let mut data: *const c_void = std::ptr::null();
        let mut length = 0usize;
        // SAFETY: the handle is open; on success libsystemd points `data` at `length` bytes it
        // owns until the next call on the handle, which the borrow of `self` rules out.
        let rc =
            unsafe { (self.call().get_data)(self.handle, field.as_ptr(), &mut data, &mut length) };
        match check(rc) {
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        // SAFETY: as above: `length` bytes at `data`, alive while `self` is borrowed.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) };
        Ok(Some(
            bytes.get(field.to_bytes().len() + 1..).unwrap_or_default(),
        ))
    }

    /// When journald stored the current entry (`__REALTIME_TIMESTAMP`).
    pub fn realtime_usec(&mut self) -> Result<u64, Errno> {
        let mut usec = 0u64;
        // SAFETY: the handle is open; `usec` is written on success.
        check(unsafe { (self.call().get_realtime_usec)(self.handle, &mut usec) })?;
        Ok(usec)
    }

    /// The current entry's cursor: where to resume after it in another journal of the same files.
    pub fn cursor(&mut self) -> Result<CString, Errno> {
        let mut cursor: *mut c_char = std::ptr::null_mut();
        // SAFETY: the handle is open; on success `cursor` is a string malloc'd for the caller.
        check(unsafe { (self.call().get_cursor)(self.handle, &mut cursor) })?;
        // SAFETY: a NUL-terminated string libsystemd allocated with malloc, freed once here.
        let owned = unsafe { CStr::from_ptr(cursor) }.to_owned();
        // SAFETY: as above.
        unsafe { libc::free(cursor.cast()) };
        Ok(owned)
    }

    /// Waits up to `timeout` for the files to change (inotify on their directories; the first
    /// call sets the watches up and returns at once).
    pub fn wait(&mut self, timeout: Duration) -> Result<Change, Errno> {
        let usec = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX - 1);
        // SAFETY: the handle is open.
        match check(unsafe { (self.call().wait)(self.handle, usec) })? {
            0 => Ok(Change::Nothing),
            1 => Ok(Change::Appended),
            _ => Ok(Change::Invalidated),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // SAFETY: the handle is open, and closed once.
        unsafe { (self.call().close)(self.handle) }
    }
}
