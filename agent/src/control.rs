//! The control channel: the messages of background processes between the host and
//! the agent (one JSON object per `SOCK_SEQPACKET` message, descriptors attached),
//! how they travel ([`send_with_fds`], [`recv_with_fds`]), and the agent's reading
//! and answering of them. The container engine speaks the host's end with the same
//! types (`docs/protocol.md`, "The container agent's control channel").

use std::collections::BTreeMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::sys;
use crate::Agent;

/// fd 3 when the host passed a `SOCK_SEQPACKET` socket there: the control channel
/// (close-on-exec, so no command inherits it).
pub(crate) fn channel() -> Option<OwnedFd> {
    sys::take_inherited_control_socket()
}

/// The largest control message (a spawn's argv and environment included).
pub const CONTROL_MESSAGE_MAX: usize = 128 * 1024;

/// One message on the control channel: a JSON object per `SOCK_SEQPACKET` message,
/// with `"v": 1` and the message's fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControlFrame {
    /// The protocol version, 1.
    pub v: u32,
    /// The message.
    #[serde(flatten)]
    pub message: ControlMessage,
}

impl ControlFrame {
    /// `message` as bytes to send.
    pub fn encode(message: &ControlMessage) -> Vec<u8> {
        serde_json::to_vec(&ControlFrame {
            v: 1,
            message: message.clone(),
        })
        .expect("control messages serialize")
    }

    /// The message in `bytes`, if it is a version-1 control frame.
    pub fn decode(bytes: &[u8]) -> Result<ControlMessage, String> {
        let frame: ControlFrame = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if frame.v != 1 {
            return Err(format!("version {} is not 1", frame.v));
        }
        Ok(frame.message)
    }
}

/// A message on the control channel, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ControlMessage {
    /// Host → agent: start a background process. Without `tty` three descriptors
    /// (stdin, stdout, stderr) come with the message; a `runner` gets a fourth, its
    /// fd 3 (the frames a warm runner writes).
    Spawn {
        /// The host's name for the process, echoed in every answer about it.
        id: String,
        /// The program and its arguments (the program is looked up on the
        /// environment's `PATH`).
        argv: Vec<String>,
        /// Its whole environment.
        env: BTreeMap<String, String>,
        /// Its working directory, inside the container.
        cwd: String,
        /// (rows, cols) of a terminal the agent opens for it.
        tty: Option<(u16, u16)>,
        /// A warm runner (`docs/protocol.md`, section 13): `started` carries its
        /// pidfd, and a `sweep` spares it but not the rest of its session.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        runner: bool,
    },
    /// Host → agent: kill what a runner's turn left behind: every process of the
    /// container but the agent, the runners themselves and the sessions of the
    /// other background processes. Answered with `swept`.
    Sweep {
        /// The host's name for this sweep, echoed in `swept`.
        id: String,
    },
    /// Host → agent: return the container to the state it started in, for another
    /// lease (maybe another tenant's): every process but the agent killed (each
    /// background process reported `exited`), System V IPC objects and POSIX message
    /// queues removed, `/tmp`, `/dev/shm` and `/dev` as they were at start, the
    /// agent's inheritable attributes put back. Answered with `reset_done`.
    Reset {
        /// The host's name for this reset, echoed in `reset_done`.
        id: String,
    },
    /// Host → agent: signal the process group of a background process.
    Signal {
        /// The process.
        id: String,
        /// The signal's number.
        signal: i32,
    },
    /// Host → agent: a file operation, with the write end of a pipe attached: the
    /// agent writes its [`FileAnswer`](crate::files::FileAnswer) there as one JSON
    /// line and closes it.
    Files {
        /// The host's name for the operation.
        id: String,
        /// The operation.
        op: crate::files::FileOp,
    },
    /// Host → agent: watch directory `path` (and below when `recursive`), with the
    /// write end of a pipe attached: the agent writes a
    /// [`FileAnswer`](crate::files::FileAnswer) line (empty, or the error), then a
    /// [`WireEvent`](crate::files::WireEvent) line per change, until the host closes
    /// its end, the directory goes or a reset.
    Watch {
        /// The host's name for the watch.
        id: String,
        /// The directory, an absolute path of the container.
        path: String,
        /// Whether everything below it is watched too.
        recursive: bool,
    },
    /// Agent → host: it runs as `pid` (in the container); a terminal's master, or a
    /// runner's pidfd, comes with the message.
    Started {
        /// The process.
        id: String,
        /// Its pid in the container's pid namespace.
        pid: libc::pid_t,
    },
    /// Agent → host: the sweep `id` is done; `killed` processes were found.
    Swept {
        /// The sweep.
        id: String,
        /// How many processes it found to kill.
        killed: u32,
    },
    /// Agent → host: the reset `id` is over. With `ok` the container is as it was
    /// when the agent started; without, `message` names what could not be reset,
    /// and the container must not serve another lease.
    ResetDone {
        /// The reset.
        id: String,
        /// Whether everything was reset.
        ok: bool,
        /// What could not be reset (empty with `ok`).
        message: String,
    },
    /// Agent → host: it could not start.
    Failed {
        /// The process.
        id: String,
        /// Why.
        message: String,
    },
    /// Agent → host: it ended (and what it left in its session was killed).
    Exited {
        /// The process.
        id: String,
        /// Its exit code; `128 + signal` when a signal ended it.
        exit_code: i32,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
}

/// Most descriptors one control message carries.
pub const MAX_PASSED_FDS: usize = 12;

/// Room for one `SCM_RIGHTS` message of [`MAX_PASSED_FDS`] descriptors.
const FD_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_PASSED_FDS));

/// Sends one message on a `SOCK_SEQPACKET` socket with `fds` attached (at most
/// [`MAX_PASSED_FDS`]).
pub fn send_with_fds(sock: impl AsFd, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(
        fds.len() <= MAX_PASSED_FDS,
        "at most {MAX_PASSED_FDS} descriptors"
    );
    let mut space = [MaybeUninit::<u8>::uninit(); FD_SPACE];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let fits = control.push(SendAncillaryMessage::ScmRights(fds));
        debug_assert!(fits, "the buffer holds {MAX_PASSED_FDS} descriptors");
    }
    loop {
        match rustix::net::sendmsg(
            &sock,
            &[IoSlice::new(data)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message from a `SOCK_SEQPACKET` socket into `buf`, with the
/// descriptors attached to it (close-on-exec). `Ok((0, _))` at the end. A message
/// cut to fit, its data or its descriptors (more than [`MAX_PASSED_FDS`]; the kernel
/// drops those that do not fit), is an `InvalidData` error, and the descriptors that
/// did arrive with it are closed.
pub fn recv_with_fds(sock: impl AsFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::<u8>::uninit(); FD_SPACE];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match rustix::net::recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut *buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = message {
            fds.extend(passed);
        }
    }
    if received.flags.contains(ReturnFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a control message larger than the buffer was cut",
        ));
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        // `fds` goes with the error: what arrived is closed, not half-delivered.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a control message carried more descriptors than the {MAX_PASSED_FDS} it may; \
                 those past the room were lost, and the message is refused"
            ),
        ));
    }
    Ok((received.bytes, fds))
}

impl Agent {
    /// Reads and handles one control message.
    pub(crate) fn read_control(&mut self) {
        let Some(sock) = self.control.as_ref() else {
            return;
        };
        let mut buf = vec![0u8; CONTROL_MESSAGE_MAX];
        let (n, fds) = match recv_with_fds(sock, &mut buf) {
            Ok((0, _)) | Err(_) => {
                // The host closed it: no more background processes.
                self.control = None;
                return;
            }
            Ok(r) => r,
        };
        match ControlFrame::decode(&buf[..n]) {
            Ok(ControlMessage::Spawn {
                id,
                argv,
                env,
                cwd,
                tty,
                runner,
            }) => self.spawn_background(id, argv, env, cwd, (tty, runner), fds),
            Ok(ControlMessage::Sweep { id }) => {
                let killed = self.sweep();
                self.answer(&ControlMessage::Swept { id, killed }, None);
            }
            Ok(ControlMessage::Reset { id }) => {
                let (ok, message) = match self.reset() {
                    Ok(()) => (true, String::new()),
                    Err(why) => (false, why),
                };
                self.answer(&ControlMessage::ResetDone { id, ok, message }, None);
            }
            Ok(ControlMessage::Files { op, .. }) => {
                if let Some(fd) = fds.into_iter().next() {
                    let mut out = std::fs::File::from(fd);
                    crate::files::answer(&mut out, &crate::files::run(&op));
                }
            }
            Ok(ControlMessage::Watch {
                path, recursive, ..
            }) => {
                if let Some(fd) = fds.into_iter().next() {
                    match crate::files::Watch::start(&path, recursive, fd) {
                        Ok(mut w) => {
                            crate::files::answer(&mut w.out, &Default::default());
                            self.watches.push(w);
                        }
                        Err((e, fd)) => {
                            let answer = crate::files::FileAnswer {
                                error: Some(e),
                                ..Default::default()
                            };
                            crate::files::answer(&mut std::fs::File::from(fd), &answer);
                        }
                    }
                }
            }
            Ok(ControlMessage::Signal { id, signal }) => {
                if let Some(b) = self.background.iter().find(|b| b.id == id) {
                    // The group of a process not yet reaped.
                    sys::kill_group(b.pid, signal);
                }
            }
            Ok(other) => {
                eprintln!("paddock-agent: ignoring a control message for the host: {other:?}")
            }
            Err(e) => {
                eprintln!("paddock-agent: ignoring a control message that does not parse: {e}")
            }
        }
    }

    /// Sends `message` to the host, with `fd` attached.
    pub(crate) fn answer(&self, message: &ControlMessage, fd: Option<BorrowedFd<'_>>) {
        if let Some(sock) = &self.control {
            let bytes = ControlFrame::encode(message);
            let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
            let _ = send_with_fds(sock, &bytes, &fds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_round_trip_and_carry_the_version() {
        let spawn = ControlMessage::Spawn {
            id: "p1".into(),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            cwd: "/workspace".into(),
            tty: Some((24, 80)),
            runner: false,
        };
        let bytes = ControlFrame::encode(&spawn);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains(r#""v":1"#) && text.contains(r#""kind":"spawn""#),
            "{text}"
        );
        assert_eq!(ControlFrame::decode(&bytes).unwrap(), spawn);
        assert!(
            !text.contains("runner"),
            "a plain spawn says nothing of runners: {text}"
        );
        let runner = ControlMessage::Spawn {
            id: "r1".into(),
            argv: vec!["python3".into(), "/tmp/.paddock-runners/python.py".into()],
            env: BTreeMap::new(),
            cwd: "/workspace".into(),
            tty: None,
            runner: true,
        };
        assert_eq!(
            ControlFrame::decode(&ControlFrame::encode(&runner)).unwrap(),
            runner
        );
        assert_eq!(
            ControlFrame::decode(br#"{"v":1,"kind":"sweep","id":"s1"}"#).unwrap(),
            ControlMessage::Sweep { id: "s1".into() }
        );
        let reset = ControlMessage::Reset { id: "r1".into() };
        assert_eq!(
            ControlFrame::encode(&reset),
            br#"{"v":1,"kind":"reset","id":"r1"}"#
        );
        let done =
            br#"{"v":1,"kind":"reset_done","id":"r1","ok":false,"message":"/dev/null: gone"}"#;
        let decoded = ControlFrame::decode(done).unwrap();
        assert_eq!(
            decoded,
            ControlMessage::ResetDone {
                id: "r1".into(),
                ok: false,
                message: "/dev/null: gone".into()
            }
        );
        assert_eq!(ControlFrame::encode(&decoded), done);
        let exited = br#"{"v":1,"kind":"exited","id":"p1","exit_code":137,"signal":9}"#;
        assert_eq!(
            ControlFrame::decode(exited).unwrap(),
            ControlMessage::Exited {
                id: "p1".into(),
                exit_code: 137,
                signal: Some(9)
            }
        );
        assert!(ControlFrame::decode(br#"{"v":2,"kind":"signal","id":"p1","signal":9}"#).is_err());
        assert!(ControlFrame::decode(br#"{"v":1,"kind":"bogus"}"#).is_err());
        assert!(ControlFrame::decode(b"not json").is_err());
    }

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn descriptors_travel_with_their_message() {
        use std::io::{Read, Write};
        let (a, b) = seqpacket_pair();
        let (mut r, w) = std::io::pipe().unwrap();
        send_with_fds(&a, b"first", &[w.as_fd()]).unwrap();
        drop(w);
        send_with_fds(&a, b"second", &[]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"first");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end.
        let mut writer = std::fs::File::from(fds.into_iter().next().unwrap());
        writer.write_all(b"through").unwrap();
        drop(writer);
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "through");
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"second"[..], 0));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf).unwrap().0, 0);
    }

    #[test]
    fn more_descriptors_than_the_buffer_holds_are_an_error_and_none_stays_open() {
        use std::os::fd::AsRawFd;
        let (a, b) = seqpacket_pair();
        let (r, w) = std::io::pipe().unwrap();
        {
            // Four times what a message may carry, past the receiver's room: the kernel
            // installs what fits and drops the rest.
            let many = vec![w.as_fd(); 4 * MAX_PASSED_FDS];
            let mut space =
                vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(many.len()))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            assert!(control.push(SendAncillaryMessage::ScmRights(&many)));
            rustix::net::sendmsg(
                &a,
                &[IoSlice::new(b"many")],
                &mut control,
                SendFlags::empty(),
            )
            .unwrap();
        }
        drop(w);
        let mut buf = [0u8; 64];
        let e = recv_with_fds(&b, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // The copies that did arrive were closed: the pipe has no writer left. (A
        // program another test starts meanwhile may hold a copy until its exec, hence
        // the wait.)
        let mut ready = [libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(
            sys::poll(&mut ready, 5_000).unwrap(),
            1,
            "a received copy stayed open"
        );
        assert_ne!(ready[0].revents & libc::POLLHUP, 0);
    }

    #[test]
    fn an_oversized_message_is_an_error_not_a_cut() {
        let (a, b) = seqpacket_pair();
        send_with_fds(&a, &[7u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        let e = recv_with_fds(&b, &mut small).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
