//! Node loss, leader loss and partitions (filled in below).
