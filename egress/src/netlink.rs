//! Netfilter netlink messages, as the kernel reads and writes them: a netlink header,
//! the netfilter header (`struct nfgenmsg`), then attributes, each padded to four
//! bytes. Built and read here without a C library; the firewall sends and receives
//! them (see `firewall`).

/// One netfilter netlink message being built: the netlink header, the netfilter
/// header, then attributes (nested ones opened with [`Message::nest`]).
pub(crate) struct Message {
    buf: Vec<u8>,
    open: Vec<usize>,
}

impl Message {
    pub(crate) fn new(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Message {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // the length, set by `finish`
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // to the kernel
        buf.push(family);
        buf.push(libc::NFNETLINK_V0 as u8);
        buf.extend_from_slice(&res_id.to_be_bytes());
        Message {
            buf,
            open: Vec::new(),
        }
    }

    pub(crate) fn attr(&mut self, kind: u16, data: &[u8]) {
        self.buf
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }

    pub(crate) fn nest(&mut self, kind: u16) {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | libc::NLA_F_NESTED as u16).to_ne_bytes());
    }

    pub(crate) fn end(&mut self) {
        let at = self.open.pop().expect("a nested attribute is open");
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub(crate) fn finish(mut self, into: &mut Vec<u8>) {
        debug_assert!(self.open.is_empty());
        let len = self.buf.len() as u32;
        self.buf[..4].copy_from_slice(&len.to_ne_bytes());
        into.extend_from_slice(&self.buf);
    }
}

/// The messages of one datagram: type, sequence number, and what follows the
/// netlink header.
pub(crate) fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let head = buf.get(at..at + 16)?;
        let len = u32::from_ne_bytes(head[..4].try_into().ok()?) as usize;
        if len < 16 || at + len > buf.len() {
            return None;
        }
        let kind = u16::from_ne_bytes(head[4..6].try_into().ok()?);
        let seq = u32::from_ne_bytes(head[8..12].try_into().ok()?);
        let payload = &buf[at + 16..at + len];
        at += len.next_multiple_of(4);
        Some((kind, seq, payload))
    })
}

/// The attributes of a netfilter message's payload (after its netfilter header):
/// type (flags cleared) and data.
pub(crate) fn attributes(payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 4;
    std::iter::from_fn(move || {
        let head = payload.get(at..at + 4)?;
        let len = u16::from_ne_bytes([head[0], head[1]]) as usize;
        let kind = u16::from_ne_bytes([head[2], head[3]]) & libc::NLA_TYPE_MASK as u16;
        if len < 4 || at + len > payload.len() {
            return None;
        }
        let data = &payload[at + 4..at + len];
        at += len.next_multiple_of(4);
        Some((kind, data))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `NFT_MSG_NEWSETELEM` of the `nf_tables` subsystem, and three of its attributes.
    const NEWSETELEM: u16 = ((libc::NFNL_SUBSYS_NFTABLES << 8) | libc::NFT_MSG_NEWSETELEM) as u16;
    const LIST_TABLE: u16 = 1;
    const LIST_ELEMENTS: u16 = 3;
    const DATA_VALUE: u16 = 1;

    #[test]
    fn messages_are_framed_as_the_kernel_reads_them() {
        let table: &[u8] = b"paddock\0";
        let mut out = Vec::new();
        let mut m = Message::new(NEWSETELEM, 5, 7, 1, 0);
        m.attr(LIST_TABLE, table);
        m.nest(LIST_ELEMENTS);
        m.attr(DATA_VALUE, &[1, 2, 3, 4]);
        m.end();
        m.finish(&mut out);
        assert_eq!(out.len() % 4, 0);
        let all: Vec<_> = messages(&out).collect();
        assert_eq!(all.len(), 1);
        let (kind, seq, payload) = all[0];
        assert_eq!((kind, seq), (NEWSETELEM, 7));
        let attrs: Vec<_> = attributes(payload).collect();
        assert_eq!(attrs[0], (LIST_TABLE, table));
        assert_eq!(attrs[1].0, LIST_ELEMENTS);
        assert_eq!(attrs[1].1.len(), 8);
        // Truncated or garbled input ends the walk; it never panics.
        for cut in 0..out.len() {
            let _ = messages(&out[..cut]).count();
            let _ = attributes(&out[..cut]).count();
        }
    }
}
